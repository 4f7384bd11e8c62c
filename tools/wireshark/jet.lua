-- jet.lua: Wireshark dissector for the jet binary wire protocol, version 1.0
-- (spec/PROTOCOL.md is normative; section numbers below refer to it).
--
-- Wireshark / tshark 4.0 (Lua 5.2 API). Registered on TCP port 11124 (PROTOCOL.md 3)
-- and as a heuristic TCP dissector that recognises a stream starting with an INFO
-- frame (PROTOCOL.md 4.4). Frames split across segments are reassembled with
-- dissect_tcp_pdus; several frames in one segment each get their own subtree.
--
-- Field names match the JSON field names of `jetdump --json` (jet.<name>; INFO
-- fields are jet.info.<name>), so that the two can be compared field by field.
--
--   tshark -X lua_script:tools/wireshark/jet.lua -r capture.pcap -Y jet
--   tshark -X lua_script:tools/wireshark/jet.lua -r capture.pcap -T fields -e jet.key

local jet = Proto("jet", "Jet binary protocol")

local HEADER_SIZE = 5 -- PROTOCOL.md 3: type:u8 | length:u32

local frame_types = { [1] = "REQUEST", [2] = "RESPONSE", [3] = "EVENT", [4] = "INFO" }
local functions = {
    [0x01] = "ADD_STATE", [0x02] = "REMOVE_STATE", [0x03] = "SET_STATE", [0x04] = "NOTIFY_STATE",
    [0x05] = "CALL_METHOD", [0x06] = "ADD_METHOD", [0x07] = "REMOVE_METHOD", [0x08] = "FETCH_STATES",
    [0x09] = "UNFETCH", [0x0A] = "GET_STATE",
    [0x0B] = "FETCH_QUERY", [0x0C] = "QUERY_ONCE", -- PROTOCOL.md 14 (1.1)
    [0x09] = "UNFETCH", [0x0A] = "GET_STATE", [0x10] = "AUTHENTICATE",
}
local event_codes = {
    [0x03] = "SET_STATE", [0x04] = "NOTIFY_STATE", [0x05] = "CALL_METHOD",
    [0x81] = "FETCH_ADD", [0x82] = "FETCH_CHANGE", [0x83] = "FETCH_REMOVE", [0xF0] = "CLOSE",
    [0x84] = "FETCH_UNMATCH", [0x85] = "FETCH_METHOD", [0x86] = "FETCH_NODE",
    [0x87] = "FETCH_WINDOW", [0x88] = "QUERY_ENTRY", -- PROTOCOL.md 14 (1.1)
}
-- PROTOCOL.md 14.1, 14.2, 14.4
local path_ops = { [1] = "STARTS_WITH", [2] = "ENDS_WITH", [3] = "CONTAINS", [4] = "EQUALS",
    [5] = "EQUALS_ONE_OF", [6] = "CONTAINS_ALL_OF" }
local filter_ops = { [1] = "EQ", [2] = "NE", [3] = "LT", [4] = "LE", [5] = "GT", [6] = "GE", [7] = "IS_TYPE" }
local sort_bys = { [0] = "NONE", [1] = "KEY", [2] = "VALUE", [3] = "FIELD" }
local actions = { [1] = "ADD", [2] = "REMOVE" }
local entry_kinds = { [1] = "STATE", [2] = "METHOD", [3] = "NODE" }
local statuses = {
    [0x00] = "OK", [0x01] = "NOT_FOUND", [0x02] = "ALREADY_EXISTS", [0x03] = "NOT_OWNER",
    [0x04] = "REJECTED", [0x05] = "TIMEOUT", [0x06] = "OWNER_GONE", [0x07] = "MALFORMED",
    [0x08] = "UNKNOWN_FUNCTION", [0x09] = "TOO_LARGE", [0x0A] = "LIMIT_EXCEEDED",
    [0x0B] = "WRONG_KIND", [0x0C] = "INTERNAL", [0x0D] = "OVERLOADED",
    [0x10] = "INVALID_QUERY", -- PROTOCOL.md 14.6 (1.1)
    [0x0E] = "AUTH_FAILED", [0x0F] = "NOT_AUTHORIZED", -- PROTOCOL.md 15 (protocol 1.1)
}
local value_types = {
    [0x00] = "NONE", [0x01] = "BOOL", [0x02] = "INT64", [0x03] = "FLOAT64", [0x04] = "STRING",
    [0x05] = "JSON", [0x06] = "BYTES", [0x07] = "CBOR", [0x08] = "MSGPACK",
}
local fixed_width = { [0x00] = 0, [0x01] = 1, [0x02] = 8, [0x03] = 8 } -- PROTOCOL.md 5.3

local f = jet.fields
f.type = ProtoField.uint8("jet.type", "Frame type", base.DEC, frame_types)
f.length = ProtoField.uint32("jet.length", "Body length (bytes after the 5-byte header)", base.DEC)
f.id = ProtoField.uint32("jet.id", "Request id (a response echoes it)", base.DEC)
f["function"] = ProtoField.uint8("jet.function", "Request function", base.DEC, functions)
f.status = ProtoField.uint8("jet.status", "Response status", base.DEC, statuses)
f.code = ProtoField.uint8("jet.code", "EVENT frame code", base.DEC, event_codes)
f.fetch_id = ProtoField.uint32("jet.fetch_id", "Fetch id (names one fetch or query)", base.DEC)
f.key_length = ProtoField.uint16("jet.key_length", "Key length (bytes)", base.DEC)
f.key = ProtoField.string("jet.key", "Key (of a state, method or node)", base.UNICODE)
f.prefix_length = ProtoField.uint16("jet.prefix_length", "FETCH_STATES key prefix length (bytes)", base.DEC)
f.prefix = ProtoField.string("jet.prefix", "FETCH_STATES key prefix", base.UNICODE)
f.message_length = ProtoField.uint16("jet.message_length", "Status message length (bytes)", base.DEC)
f.message = ProtoField.string("jet.message", "Status message (error text of a response or CLOSE)", base.UNICODE)
f.value_type = ProtoField.uint8("jet.value_type", "Value type", base.DEC, value_types)
f.value_length = ProtoField.uint32("jet.value_length", "Value data length (bytes)", base.DEC)
f.value = ProtoField.bytes("jet.value", "Value data (raw bytes)")
f.value_bool = ProtoField.bool("jet.value.bool", "Value (BOOL)")
f.value_int64 = ProtoField.int64("jet.value.int64", "Value (INT64)", base.DEC)
f.value_float64 = ProtoField.double("jet.value.float64", "Value (FLOAT64)")
f.value_string = ProtoField.string("jet.value.string", "Value (STRING)", base.UNICODE)
f.value_json = ProtoField.string("jet.value.json", "Value (JSON)", base.UNICODE)
f.info_major = ProtoField.uint8("jet.info.major", "Protocol major version", base.DEC)
f.info_minor = ProtoField.uint8("jet.info.minor", "Protocol minor version", base.DEC)
f.info_max_body = ProtoField.uint32("jet.info.max_body", "Largest body the sender accepts (bytes)", base.DEC)
f.info_features = ProtoField.uint32("jet.info.features", "Feature bits the sender supports", base.HEX)
f.info_conflation = ProtoField.bool("jet.info.features.conflation", "CONFLATION: the daemon may conflate FETCH_CHANGE events", 32, nil, 0x00000001)
f.info_queries = ProtoField.bool("jet.info.features.queries", "QUERIES: FETCH_QUERY and QUERY_ONCE supported", 32, nil, 0x00000002)
f.info_auth_required = ProtoField.bool("jet.info.features.auth_required", "AUTH_REQUIRED: the daemon enforces permissions (AUTHENTICATE)", 32, nil, 0x00000004)
f.info_limits = ProtoField.bool("jet.info.features.limits", "LIMITS: a peer asks for the daemon's limits; the daemon announces them", 32, nil, 0x00000008)
f.info_max_key_length = ProtoField.uint16("jet.info.max_key_length", "Daemon's maximum key length (bytes)", base.DEC)
f.info_route_timeout_ms = ProtoField.uint32("jet.info.route_timeout_ms", "Daemon's route timeout for routed requests (ms)", base.DEC)
f.user_length = ProtoField.uint16("jet.user_length", "AUTHENTICATE user name length (bytes)", base.DEC)
f.user = ProtoField.string("jet.user", "AUTHENTICATE user name", base.UNICODE)
f.password_length = ProtoField.uint16("jet.password_length", "AUTHENTICATE password length (bytes)", base.DEC)
f.password = ProtoField.string("jet.password", "AUTHENTICATE password (always masked)", base.UNICODE)
f.info_name_length = ProtoField.uint16("jet.info.name_length", "Sender name length (bytes)", base.DEC)
f.info_name = ProtoField.string("jet.info.name", "Sender name (peer or daemon)", base.UNICODE)
f.query_flags = ProtoField.uint8("jet.query.flags", "Query flags (METHODS, NODES)", base.HEX)
f.matcher_count = ProtoField.uint8("jet.query.matcher_count", "Query key matcher count", base.DEC)
f.matcher_op = ProtoField.uint8("jet.query.matcher.op", "Query key matcher test", base.DEC, path_ops)
f.matcher_flags = ProtoField.uint8("jet.query.matcher.flags", "Query key matcher flags (NOT, IGNORE_CASE)", base.HEX)
f.operand_count = ProtoField.uint8("jet.query.matcher.count", "Query key matcher operand count", base.DEC)
f.operand_length = ProtoField.uint16("jet.query.matcher.operand_length", "Query key matcher operand length (bytes)", base.DEC)
f.operand = ProtoField.string("jet.query.matcher.operand", "Query key matcher operand", base.UNICODE)
f.filter_count = ProtoField.uint8("jet.query.filter_count", "Query value filter count", base.DEC)
f.filter_op = ProtoField.uint8("jet.query.filter.op", "Query value filter comparison", base.DEC, filter_ops)
f.filter_flags = ProtoField.uint8("jet.query.filter.flags", "Query value filter flags (reserved)", base.HEX)
f.field_length = ProtoField.uint16("jet.query.field_length", "Query value field path length (bytes)", base.DEC)
f.field = ProtoField.string("jet.query.field", "Query value field path (into a JSON, CBOR or MSGPACK value)", base.UNICODE)
f.sort_by = ProtoField.uint8("jet.query.sort_by", "Query sort order: by key, value or field", base.DEC, sort_bys)
f.sort_flags = ProtoField.uint8("jet.query.sort_flags", "Query sort flags (DESCENDING)", base.HEX)
f.window_from = ProtoField.uint32("jet.query.from", "Sorted window first position (1-based)", base.DEC)
f.window_to = ProtoField.uint32("jet.query.to", "Sorted window last position (inclusive)", base.DEC)
f.action = ProtoField.uint8("jet.action", "FETCH_METHOD/FETCH_NODE action (ADD or REMOVE)", base.DEC, actions)
f.window_size = ProtoField.uint32("jet.window.size", "FETCH_WINDOW entries now in the window", base.DEC)
f.entry_count = ProtoField.uint16("jet.window.entry_count", "FETCH_WINDOW entries listed in this event", base.DEC)
f.index = ProtoField.uint32("jet.window.index", "FETCH_WINDOW entry position (1-based, in the whole order)", base.DEC)
f.kind = ProtoField.uint8("jet.entry.kind", "QUERY_ENTRY kind (STATE, METHOD or NODE)", base.DEC, entry_kinds)
f.response_to = ProtoField.framenum("jet.response_to", "This response answers the request in frame", base.NONE)
f.response_in = ProtoField.framenum("jet.response_in", "This request is answered in frame", base.NONE)
f.request_function = ProtoField.uint8("jet.request_function", "Function of the request this answers", base.DEC, functions)
f.rtt_ms = ProtoField.double("jet.rtt_ms", "Time since request (ms)")
-- As dns.time and http.time: the time since the request, a relative time in seconds.
f.time = ProtoField.relative_time("jet.time", "Time since request")
f.malformed = ProtoField.string("jet.malformed", "Malformed frame: reason")
f.truncated = ProtoField.string("jet.truncated", "Truncated frame (capture ends inside it): reason")
f.gap = ProtoField.uint32("jet.gap", "Bytes of the jet stream sent but not captured", base.DEC)

local e_malformed = ProtoExpert.new("jet.malformed.expert", "Malformed jet frame", expert.group.MALFORMED, expert.severity.ERROR)
local e_oversized = ProtoExpert.new("jet.oversized", "Frame length above the maximum body", expert.group.MALFORMED, expert.severity.ERROR)
local e_unknown_type = ProtoExpert.new("jet.unknown_type", "Unknown frame type: stream boundary lost", expert.group.MALFORMED, expert.severity.ERROR)
local e_lost = ProtoExpert.new("jet.boundary_lost", "Data after a lost frame boundary", expert.group.SEQUENCE, expert.severity.WARN)
local e_error_status = ProtoExpert.new("jet.error_status", "Error response", expert.group.RESPONSE_CODE, expert.severity.NOTE)
local e_violation = ProtoExpert.new("jet.violation", "Protocol violation", expert.group.PROTOCOL, expert.severity.WARN)
jet.experts = { e_malformed, e_oversized, e_unknown_type, e_lost, e_error_status, e_violation }
-- Capture loss is shown by a postdissector of its own: pure ACKs and FINs, which often
-- show it, carry no payload and never reach jet.dissector.
local jet_loss = Proto("jetloss", "Jet capture loss")
local e_gap = ProtoExpert.new("jetloss.gap", "Bytes not captured", expert.group.SEQUENCE, expert.severity.WARN)
jet_loss.experts = { e_gap }

jet.prefs.port = Pref.uint("TCP port", 11124, "TCP port of jet (PROTOCOL.md 3)")
jet.prefs.max_body = Pref.uint("Maximum body", 64 * 1024 * 1024,
    "Largest body length accepted; a larger length is reported oversized and the stream boundary lost")
jet.prefs.heuristic = Pref.bool("Heuristic", true, "Take TCP streams that begin with an INFO frame as jet")
jet.prefs.route_timeout = Pref.uint("Route timeout (ms)", 0,
    "The daemon's route timeout, for flagging late answers of owners; 0: as a daemon's INFO announces it (1.2)")

-- State kept across packets (filled on the first pass only; Wireshark dissects each
-- packet again when it draws the tree).
local stopped = {}   -- direction key -> frame number where the frame boundary was lost
local requests = {}  -- conversation key .. request id -> {frame, ts}
local answers = {}   -- frame number .. ":" .. offset -> {request frame, rtt}
local answered = {}  -- request frame number .. ":" .. id -> response frame number

local tcp_stream = Field.new("tcp.stream")
-- What the loss checks read (tcp.seq and tcp.ack: relative, Wireshark's default).
local wire = {}
for _, name in ipairs({ "tcp.seq", "tcp.ack", "tcp.len", "tcp.flags", "tcp.hdr_len", "frame.len", "frame.cap_len",
                        "ip.len", "ip.hdr_len", "ipv6.plen" }) do
    wire[name] = Field.new(name)
end

-- The TCP payload length the (innermost) IP header announces, or 0 when unknown.
local function announced_payload()
    local tcp_header = wire["tcp.hdr_len"]()
    if not tcp_header then return 0 end
    local lengths, headers, plens = { wire["ip.len"]() }, { wire["ip.hdr_len"]() }, { wire["ipv6.plen"]() }
    local total, header, plen = lengths[#lengths], headers[#headers], plens[#plens]
    if total and header and total.value > 0 then return total.value - header.value - tcp_header.value end
    if plen then return plen.value - tcp_header.value end
    return 0
end

-- State is kept per TCP stream and direction, not per address and port: a reused
-- 4-tuple is another stream (issue 18).
local function direction_key(pinfo, forward)
    local stream = tcp_stream()
    local prefix = stream and (tostring(stream.value) .. "/") or ""
    local a = tostring(pinfo.src) .. ":" .. tostring(pinfo.src_port)
    local b = tostring(pinfo.dst) .. ":" .. tostring(pinfo.dst_port)
    if forward then return prefix .. a .. ">" .. b end
    return prefix .. b .. ">" .. a
end

-- Strict UTF-8 check (PROTOCOL.md 5.1: invalid UTF-8 is MALFORMED).
local function valid_utf8(s)
    local i, n = 1, #s
    while i <= n do
        local c = s:byte(i)
        local need, min
        if c < 0x80 then need, min = 0, 0
        elseif c >= 0xC2 and c <= 0xDF then need, min = 1, 0x80
        elseif c >= 0xE0 and c <= 0xEF then need, min = 2, 0x800
        elseif c >= 0xF0 and c <= 0xF4 then need, min = 3, 0x10000
        else return false end
        if i + need > n then return false end
        local cp = (need == 0) and c or (c % (2 ^ (6 - need)))
        for k = 1, need do
            local cc = s:byte(i + k)
            if cc < 0x80 or cc > 0xBF then return false end
            cp = cp * 64 + (cc - 0x80)
        end
        if cp < min or cp > 0x10FFFF or (cp >= 0xD800 and cp <= 0xDFFF) then return false end
        i = i + need + 1
    end
    return true
end

-- A small cursor over one frame's body; every read checks the bytes are there.
local Body = {}
Body.__index = Body

local function new_body(tvb, start, stop, tree, pinfo)
    return setmetatable({ tvb = tvb, pos = start, stop = stop, tree = tree, err = nil, pinfo = pinfo }, Body)
end

function Body:fail(reason)
    if not self.err then self.err = reason end
    return nil
end

function Body:left() return self.stop - self.pos end

function Body:uint(size, field, what)
    if self.err then return nil end
    -- (A ProtoField has no readable name in tshark 4.0's Lua: the caller names it.)
    if self:left() < size then return self:fail((what or "a field") .. " truncated") end
    local range = self.tvb(self.pos, size)
    self.tree:add(field, range)
    self.pos = self.pos + size
    return range:uint()
end

function Body:str16(len_field, text_field, what, min_len)
    if self.err then return nil end
    if self:left() < 2 then return self:fail(what .. " length truncated") end
    local n = self.tvb(self.pos, 2):uint()
    self.tree:add(len_field, self.tvb(self.pos, 2))
    self.pos = self.pos + 2
    if n > self:left() then return self:fail(what .. " length " .. n .. " runs past the body end") end
    if min_len and n < min_len then return self:fail("empty " .. what) end
    local text = ""
    if n > 0 then
        local range = self.tvb(self.pos, n)
        text = range:raw()
        if not valid_utf8(text) then
            -- Shown with replacement characters, never as raw invalid bytes.
            self.tree:add_packet_field(text_field, range, ENC_UTF_8)
            return self:fail(what .. " is not valid UTF-8")
        end
        self.tree:add(text_field, range, text)
    else
        self.tree:add(text_field, self.tvb(self.pos, 0), "")
    end
    self.pos = self.pos + n
    return text
end

-- JSON, CBOR and MessagePack values go to Wireshark's own dissectors too, so that their
-- fields (json.value.number, cbor.type.uint, msgpack.string ...) filter jet values. Each
-- is looked up once; a Wireshark without one just shows the bytes.
local function find_dissector(name)
    local ok, found = pcall(Dissector.get, name)
    return ok and found or nil
end
local value_dissectors = { [0x05] = find_dissector("json"), [0x07] = find_dissector("cbor"),
                           [0x08] = find_dissector("msgpack") }

-- Hand ``range`` to a value type's dissector under ``tree``; the protocol and Info
-- columns stay jet's (the sub-dissector would set its own), and a sub-dissector's
-- error stays inside its own subtree.
local function dissect_value(vtype, range, pinfo, tree)
    local sub = value_dissectors[vtype]
    if not sub or not pinfo then return end
    local protocol, info = tostring(pinfo.cols.protocol), tostring(pinfo.cols.info)
    pcall(sub.call, sub, range:tvb(), pinfo, tree)
    pinfo.cols.protocol:set(protocol)
    pinfo.cols.info:set(info)
end

-- PROTOCOL.md 5.3: a Value that must fill the rest of the body exactly (``inner``:
-- a Value that more fields follow, 14.1 and 14.2).
function Body:value(inner)
    if self.err then return nil end
    if self:left() < 5 then return self:fail("value truncated: need 5 header bytes") end
    local vtype = self.tvb(self.pos, 1):uint()
    self.tree:add(f.value_type, self.tvb(self.pos, 1))
    local n = self.tvb(self.pos + 1, 4):uint()
    self.tree:add(f.value_length, self.tvb(self.pos + 1, 4))
    self.pos = self.pos + 5
    if n > self:left() then return self:fail("value length " .. n .. " runs past the body end") end
    if vtype >= 0x09 and vtype <= 0x7F then return self:fail(string.format("reserved value type 0x%02X", vtype)) end
    local width = fixed_width[vtype]
    if width and n ~= width then
        return self:fail(value_types[vtype] .. " value must be " .. width .. " bytes, got " .. n)
    end
    local summary = value_types[vtype] or string.format("0x%02X", vtype)
    if n == 0 then
        self.tree:add(f.value, self.tvb(self.pos, 0))
    else
        local range = self.tvb(self.pos, n)
        self.tree:add(f.value, range)
        if vtype == 0x01 then
            local b = range:uint()
            if b > 1 then return self:fail(string.format("BOOL value must be 0x00 or 0x01, got 0x%02X", b)) end
            self.tree:add(f.value_bool, range, b == 1)
            summary = summary .. (b == 1 and " true" or " false")
        elseif vtype == 0x02 then
            self.tree:add(f.value_int64, range)
            summary = summary .. " " .. tostring(range:int64())
        elseif vtype == 0x03 then
            self.tree:add(f.value_float64, range)
            summary = summary .. " " .. tostring(range:float())
        elseif vtype == 0x04 or vtype == 0x05 then
            local text = range:raw()
            if not valid_utf8(text) then
                if vtype == 0x04 then return self:fail("STRING value is not valid UTF-8") end
            else
                self.tree:add(vtype == 0x04 and f.value_string or f.value_json, range, text)
                local shown = #text > 40 and (text:sub(1, 40) .. "...") or text
                summary = summary .. (vtype == 0x04 and (" \"" .. shown .. "\"") or (" " .. shown))
                if vtype == 0x05 then dissect_value(vtype, range, self.pinfo, self.tree) end
            end
        else
            summary = summary .. " " .. n .. " bytes"
            if vtype == 0x07 or vtype == 0x08 then dissect_value(vtype, range, self.pinfo, self.tree) end
        end
    end
    self.pos = self.pos + n
    if not inner and self:left() > 0 then return self:fail(self:left() .. " trailing byte(s) after the value") end
    return summary
end

-- PROTOCOL.md 14.1: a Query filling the rest of the body; returns a short summary.
function Body:query()
    self:uint(1, f.query_flags)
    local parts = {}
    local matchers = self:uint(1, f.matcher_count) or 0
    for _ = 1, matchers do
        local op = self:uint(1, f.matcher_op)
        if op and not path_ops[op] then return self:fail(string.format("unknown path matcher op 0x%02X", op)) end
        local mflags = self:uint(1, f.matcher_flags)
        local n = self:uint(1, f.operand_count) or 0
        local texts = {}
        for _ = 1, n do texts[#texts + 1] = "\"" .. tostring(self:str16(f.operand_length, f.operand, "matcher operand")) .. "\"" end
        if self.err then return nil end
        local flags = ""
        if mflags and mflags % 2 == 1 then flags = "not " end
        if mflags and math.floor(mflags / 2) % 2 == 1 then flags = flags .. "icase " end
        parts[#parts + 1] = flags .. path_ops[op]:lower() .. "(" .. table.concat(texts, ", ") .. ")"
    end
    local filters = self:uint(1, f.filter_count) or 0
    for _ = 1, filters do
        local op = self:uint(1, f.filter_op)
        if op and not filter_ops[op] then return self:fail(string.format("unknown value filter op 0x%02X", op)) end
        self:uint(1, f.filter_flags)
        local field = self:str16(f.field_length, f.field, "filter field")
        local value = self:value(true)
        if self.err then return nil end
        parts[#parts + 1] = (field ~= "" and field or "value") .. " " .. filter_ops[op] .. " " .. tostring(value)
    end
    local sort = self:uint(1, f.sort_by)
    if sort and not sort_bys[sort] then return self:fail(string.format("unknown sort_by 0x%02X", sort)) end
    local sort_flags = self:uint(1, f.sort_flags)
    local sort_field = self:str16(f.field_length, f.field, "sort field")
    local from = self:uint(4, f.window_from, "window from")
    local to = self:uint(4, f.window_to, "window to")
    if self.err then return nil end
    if sort ~= 0 then
        local desc = (sort_flags and sort_flags % 2 == 1) and " desc" or ""
        parts[#parts + 1] = "sort=" .. (sort_field ~= "" and sort_field or sort_bys[sort]) .. desc .. " " .. from .. ".." .. to
    end
    return #parts > 0 and table.concat(parts, " ") or "(everything)"
end

function Body:finish()
    if not self.err and self:left() > 0 then self:fail(self:left() .. " trailing byte(s)") end
end

local function key_value(body)
    local key = body:str16(f.key_length, f.key, "key", 1)
    local value = body:value()
    return key, value
end

-- Capture loss (issue 32): bytes that the other side's ACK or a FIN shows were sent but
-- that the capture lacks are a gap, reported at the packet that shows them; a violation
-- that a gap can explain is not flagged. Checked once per packet on the first pass, in
-- packet order, before the packet's frames are dissected.
local seqs = {}          -- direction key -> { next = first byte not captured in order, held = {from -> to}, fin }
local gaps = {}          -- packet number -> list of { bytes, key }
local gapped = {}        -- direction key -> packet number of its last gap
local loss_checked = {}  -- packet number -> true
local jet_streams = {}   -- tcp.stream -> true (taken by port or by the heuristic)

local function absorb(s)
    local again = true
    while again do
        again = false
        for from, to in pairs(s.held) do
            if from <= s.next then
                if to > s.next then s.next = to end
                s.held[from] = nil
                again = true
                break
            end
        end
    end
end

-- The bytes before ``limit`` were sent: returns how many of them were not captured.
local function sent_before(s, limit)
    local lost = 0
    while s.next < limit do
        absorb(s)
        if s.next >= limit then break end
        local first = nil
        for from in pairs(s.held) do
            if not first or from < first then first = from end
        end
        local stop = (first and first < limit) and first or limit
        lost = lost + (stop - s.next)
        s.next = stop
    end
    return lost
end

local function note_gap(number, key, bytes, why)
    local list = gaps[number] or {}
    list[#list + 1] = { bytes = bytes, key = key, why = why or "the sequence numbers say so" }
    gaps[number] = list
    gapped[key] = number
end

local function check_loss(pinfo)
    local number = pinfo.number
    if pinfo.visited or loss_checked[number] then return end
    loss_checked[number] = true
    local seq, len, flags, ack = wire["tcp.seq"](), wire["tcp.len"](), wire["tcp.flags"](), wire["tcp.ack"]()
    if not seq or not len or not flags then return end
    seq, len, flags = seq.value, len.value, flags.value
    local syn, fin, has_ack = math.floor(flags / 2) % 2 == 1, flags % 2 == 1, math.floor(flags / 16) % 2 == 1
    local mine, theirs = direction_key(pinfo, true), direction_key(pinfo, false)
    local other = seqs[theirs]
    if has_ack and ack and other then
        -- What this side acknowledges of the other direction was sent.
        local acked = ack.value
        if other.fin then
            acked = math.min(acked, other.fin) -- the FIN takes a sequence number, no byte
        elseif acked == other.next + 1 and next(other.held) == nil then
            acked = other.next -- one more: the other side's FIN, not captured
        end
        local lost = sent_before(other, acked)
        if lost > 0 then note_gap(number, theirs, lost) end
    end
    local s = seqs[mine]
    if not s then
        s = { next = syn and seq + 1 or seq, held = {} }
        seqs[mine] = s
    end
    if syn then return end
    -- A packet cut by the snaplen: its tail was sent but not captured. tcp.len counts
    -- the bytes the IP header announces when the capture file kept the length on the
    -- wire (frame.len), else the bytes captured.
    local on_wire, captured = wire["frame.len"](), wire["frame.cap_len"]()
    local got = len
    if on_wire and captured and captured.value < on_wire.value then got = math.max(0, len - (on_wire.value - captured.value)) end
    len = math.max(len, announced_payload())
    if got > 0 then
        if seq <= s.next then
            if seq + got > s.next then s.next = seq + got end
            absorb(s)
        elseif not s.held[seq] or s.held[seq] < seq + got then
            s.held[seq] = seq + got
        end
    end
    if got < len and s.next >= seq + got then
        local lost = sent_before(s, seq + len)
        if lost > 0 then note_gap(number, mine, lost, "the capture's snaplen cut this packet") end
    end
    if fin then
        s.fin = seq + len
        local lost = sent_before(s, s.fin)
        if lost > 0 then note_gap(number, mine, lost) end
    end
end

-- True when the answer to a request sent in ``pinfo``'s direction in packet
-- ``request_frame`` may be in bytes the capture lacks.
local function answer_may_be_lost(pinfo, request_frame)
    local at = gapped[direction_key(pinfo, false)]
    return at ~= nil and at >= request_frame
end

function jet_loss.dissector(tvb, pinfo, tree)
    local stream = tcp_stream()
    if not stream then return end
    if not jet_streams[stream.value] and pinfo.src_port ~= jet.prefs.port and pinfo.dst_port ~= jet.prefs.port then
        return
    end
    check_loss(pinfo)
    for _, gap in ipairs(gaps[pinfo.number] or {}) do
        local item = tree:add(jet_loss, tvb(0, 0))
        item:add(f.gap, gap.bytes):set_generated()
        item:append_text(": " .. gap.bytes .. " byte(s) not captured")
        item:add_proto_expert_info(e_gap, gap.bytes .. " byte(s) of " .. gap.key ..
            " were sent but not captured (" .. gap.why .. "): lost by the capture, not by the peers")
    end
end
register_postdissector(jet_loss)

-- Remember requests and match responses (PROTOCOL.md 4.1: the response echoes the id).
-- Protocol violations (as jetdump flags them), found on the first pass in packet order
-- and shown on every pass: slot (packet:offset) -> list of texts.
local violations = {}
local announced = {}   -- direction key -> the max_body its sender announced in INFO

local function violation(pinfo, slot, text)
    if pinfo.visited then return end
    local list = violations[slot] or {}
    list[#list + 1] = text
    violations[slot] = list
end

-- True when the frame comes from the daemon, false from a peer, nil when unknown: the
-- side on jet's port (preference) is the daemon. On another port both sides send INFO
-- at once, so which one is the daemon is not certain, and nothing is flagged.
local function from_daemon(pinfo)
    if pinfo.src_port == jet.prefs.port then return true end
    if pinfo.dst_port == jet.prefs.port then return false end
    return nil
end

-- The daemon's route timeout (ms) as a daemon's INFO announced it (PROTOCOL.md 4.4.1).
local announced_route_timeout = nil

local function route_timeout()
    if jet.prefs.route_timeout > 0 then return jet.prefs.route_timeout end
    return announced_route_timeout
end

-- The request pending per (direction, id); a peer may reuse an id while it is pending
-- (a violation, flagged): the later ones wait in the first one's ``queue``, and each
-- answer takes the oldest.
local function track_request(pinfo, tree, id, func, slot)
    if not pinfo.visited then
        local key = direction_key(pinfo, true) .. "#" .. id
        -- A request the daemon sends is a routed SET_STATE or CALL_METHOD (PROTOCOL.md 10.3).
        local entry = { frame = pinfo.number, ts = pinfo.abs_ts, func = func, routed = from_daemon(pinfo) == true }
        local earlier = requests[key]
        if earlier then
            if not answer_may_be_lost(pinfo, earlier.frame) then
                violation(pinfo, slot, "duplicate request id " .. id .. ": frame " .. earlier.frame ..
                    " with this id is still pending")
            end
            local queue = earlier.queue or {}
            queue[#queue + 1] = entry
            earlier.queue = queue
        else
            requests[key] = entry
        end
    end
    -- Known once the response has been seen: in Wireshark, or tshark with -2.
    local response = answered[pinfo.number .. ":" .. id]
    if response then
        tree:add(f.response_in, response):set_generated()
    elseif pinfo.visited and not answer_may_be_lost(pinfo, pinfo.number) then
        -- The second pass (tshark -2, or Wireshark drawing the tree): the whole capture
        -- has been read, and no response to this request came (nor was one lost).
        tree:add_proto_expert_info(e_violation, "request " .. id .. " never answered in this capture")
    end
end

local function track_response(pinfo, tree, id, offset)
    local slot = pinfo.number .. ":" .. offset
    if not pinfo.visited then
        local key = direction_key(pinfo, false) .. "#" .. id
        local req = requests[key]
        if req then
            local queue = req.queue
            if queue and #queue > 0 then
                local following = table.remove(queue, 1)
                following.queue = queue
                requests[key] = following
            else
                requests[key] = nil
            end
            local rtt = (pinfo.abs_ts - req.ts) * 1000
            answers[slot] = { frame = req.frame, rtt = rtt, func = req.func }
            answered[req.frame .. ":" .. id] = pinfo.number
            if req.routed then
                local timeout = route_timeout()
                if timeout and rtt > timeout and from_daemon(pinfo) == false then
                    violation(pinfo, slot, string.format("late answer: %.0f ms after the routed request " ..
                        "(frame %d), beyond the daemon's route timeout of %d ms: the requester was answered TIMEOUT",
                        rtt, req.frame, timeout))
                end
            end
        elseif announced[direction_key(pinfo, false)] and not gapped[direction_key(pinfo, false)] then
            -- The receiver's INFO (its first frame) is in this capture, so every request
            -- it sent on this stream is too (unless the capture lost some: a gap):
            -- nothing asked for this answer.
            violation(pinfo, slot, "unsolicited response: no request " .. id .. " of the receiver is pending")
        end
    end
    local ans = answers[slot]
    if ans then
        tree:add(f.response_to, ans.frame):set_generated()
        if ans.func then tree:add(f.request_function, ans.func):set_generated() end
        tree:add(f.rtt_ms, ans.rtt):set_generated()
        tree:add(f.time, NSTime.new(math.floor(ans.rtt / 1000), math.floor((ans.rtt % 1000) * 1e6 + 0.5)))
            :set_generated()
    end
end

local function dissect_frame(tvb, pinfo, root)
    local total = tvb:len()
    local ftype = tvb(0, 1):uint()
    local length = tvb(1, 4):uint()
    local tree = root:add(jet, tvb(0, math.min(total, HEADER_SIZE + length)))
    tree:add(f.type, tvb(0, 1))
    local len_item = tree:add(f.length, tvb(1, 4))
    local name = frame_types[ftype]
    if not name then
        -- PROTOCOL.md 9.2: an unknown type is fatal; nothing after it can be framed.
        local reason = string.format("unknown frame type 0x%02X", ftype)
        if ftype == 0x16 and total >= 3 and tvb(1, 1):uint() == 3 and tvb(2, 1):uint() <= 4 then
            -- A TLS record (handshake, version 3.x) where a jet frame should start.
            reason = "looks like TLS (a TLS handshake record, " .. tostring(tvb(0, 3):bytes()):lower():gsub("(..)", "%1 "):sub(1, -2) ..
                "), not jet: " .. reason
        end
        tree:add_proto_expert_info(e_unknown_type, reason)
        tree:add(f.malformed, tvb(0, 1), reason)
        if not pinfo.visited then stopped[direction_key(pinfo, true)] = pinfo.number end
        return string.format("MALFORMED 0x%02X", ftype)
    end
    if length > jet.prefs.max_body then
        len_item:add_proto_expert_info(e_oversized,
            "body of " .. length .. " bytes exceeds the maximum of " .. jet.prefs.max_body)
        tree:add(f.malformed, tvb(1, 4), "body of " .. length .. " bytes exceeds the maximum of " .. jet.prefs.max_body)
        if not pinfo.visited then stopped[direction_key(pinfo, true)] = pinfo.number end
        return name .. " OVERSIZED"
    end
    if total < HEADER_SIZE + length then
        local text = (total) .. " of " .. (HEADER_SIZE + length) .. " bytes present"
        tree:add(f.truncated, tvb(0, total), text)
        tree:add_proto_expert_info(e_malformed, "truncated frame: " .. text)
        return name .. " TRUNCATED"
    end
    local body = new_body(tvb, HEADER_SIZE, HEADER_SIZE + length, tree, pinfo)
    local slot = pinfo.number .. ":" .. tvb:offset()
    local limit = announced[direction_key(pinfo, false)]
    if limit and length > limit then
        violation(pinfo, slot, "body of " .. length .. " bytes above the receiver's announced max_body " .. limit)
    end
    local summary
    if ftype == 1 then -- PROTOCOL.md 4.1
        local id = body:uint(4, f.id)
        local func = body:uint(1, f["function"])
        summary = "REQUEST id=" .. tostring(id)
        if func then
            local fname = functions[func]
            if not fname then
                body:fail(string.format("unknown function 0x%02X", func))
            else
                summary = summary .. " " .. fname
                if func == 0x01 or func == 0x03 or func == 0x04 or func == 0x05 then
                    local key, value = key_value(body)
                    summary = summary .. " key=\"" .. tostring(key) .. "\" " .. tostring(value)
                elseif func == 0x08 then
                    local prefix = body:str16(f.prefix_length, f.prefix, "prefix")
                    summary = summary .. " prefix=\"" .. tostring(prefix) .. "\""
                elseif func == 0x0B or func == 0x0C then
                    summary = summary .. " " .. tostring(body:query())
                elseif func == 0x10 then
                    -- PROTOCOL.md 6.12: the password is never shown, only where it is.
                    local user = body:str16(f.user_length, f.user, "user", 1)
                    if not body.err then
                        if body:left() < 2 then
                            body:fail("password length truncated")
                        else
                            local n = tvb(body.pos, 2):uint()
                            tree:add(f.password_length, tvb(body.pos, 2))
                            body.pos = body.pos + 2
                            if n > body:left() then
                                body:fail("password length " .. n .. " runs past the body end")
                            else
                                local range = tvb(body.pos, n)
                                if not valid_utf8(range:raw()) then
                                    body:fail("password is not valid UTF-8")
                                else
                                    tree:add(f.password, range, "********")
                                    body.pos = body.pos + n
                                end
                            end
                        end
                    end
                    summary = summary .. " user=\"" .. tostring(user) .. "\" password=********"
                elseif func == 0x09 then
                    if body:left() ~= 4 then
                        body:fail("UNFETCH payload must be 4 bytes, got " .. body:left())
                    else
                        summary = summary .. " fid=" .. tostring(body:uint(4, f.fetch_id))
                    end
                else
                    local key = body:str16(f.key_length, f.key, "key", 1)
                    summary = summary .. " key=\"" .. tostring(key) .. "\""
                end
            end
        end
        if id then track_request(pinfo, tree, id, func, pinfo.number .. ":" .. tvb:offset()) end
    elseif ftype == 2 then -- PROTOCOL.md 4.2
        local id = body:uint(4, f.id)
        local status = body:uint(1, f.status)
        summary = "RESPONSE id=" .. tostring(id)
        if status then
            if not statuses[status] then
                body:fail(string.format("unknown status 0x%02X", status))
            elseif status == 0 then
                summary = summary .. " OK"
                local rest = body:left()
                if rest == 4 then
                    summary = summary .. " fid=" .. tostring(body:uint(4, f.fetch_id))
                elseif rest >= 5 then
                    summary = summary .. " " .. tostring(body:value())
                elseif rest > 0 then
                    body:fail("OK payload of " .. rest .. " bytes is neither empty, fetch_id nor Value")
                end
            else
                tree:add_proto_expert_info(e_error_status, statuses[status])
                local msg = body:str16(f.message_length, f.message, "message")
                summary = summary .. " " .. statuses[status] .. " \"" .. tostring(msg) .. "\""
            end
        end
        if id then track_response(pinfo, tree, id, tvb:offset()) end
    elseif ftype == 3 then -- PROTOCOL.md 4.3, 7
        local code = body:uint(1, f.code)
        summary = "EVENT"
        if code then
            local cname = event_codes[code]
            if code >= 0x81 and code <= 0x88 and from_daemon(pinfo) == false then
                violation(pinfo, slot, "a peer sent " .. tostring(cname or code) .. ": only the daemon sends fetch events")
            end
            if not cname then
                body:fail(string.format("unknown event code 0x%02X", code))
            else
                summary = summary .. " " .. cname
                if code == 0x85 or code == 0x86 then
                    local fid = body:uint(4, f.fetch_id)
                    local action = body:uint(1, f.action)
                    if action and not actions[action] then body:fail(string.format("unknown action 0x%02X", action)) end
                    local key = body:str16(f.key_length, f.key, "key", 1)
                    summary = summary .. " fid=" .. tostring(fid) .. " " .. tostring(actions[action or 0]) .. " key=\"" .. tostring(key) .. "\""
                elseif code == 0x87 then
                    local fid = body:uint(4, f.fetch_id)
                    local size = body:uint(4, f.window_size)
                    local n = body:uint(2, f.entry_count) or 0
                    summary = summary .. " fid=" .. tostring(fid) .. " size=" .. tostring(size)
                    for _ = 1, n do
                        local index = body:uint(4, f.index)
                        local key = body:str16(f.key_length, f.key, "key", 1)
                        body:value(true)
                        if body.err then break end
                        summary = summary .. " #" .. index .. "=\"" .. key .. "\""
                    end
                elseif code == 0x88 then
                    local rid = body:uint(4, f.id)
                    local kind = body:uint(1, f.kind)
                    if kind and not entry_kinds[kind] then body:fail(string.format("unknown entry kind 0x%02X", kind)) end
                    local key, value = key_value(body)
                    summary = summary .. " id=" .. tostring(rid) .. " " .. tostring(entry_kinds[kind or 0]) .. " key=\"" .. tostring(key) .. "\" " .. tostring(value)
                elseif code >= 0x81 and code <= 0x84 then
                    local fid = body:uint(4, f.fetch_id)
                    local key, value = key_value(body)
                    summary = summary .. " fid=" .. tostring(fid) .. " key=\"" .. tostring(key) .. "\" " .. tostring(value)
                elseif code == 0xF0 then
                    local status = body:uint(1, f.status)
                    if status and not statuses[status] then
                        body:fail(string.format("unknown status 0x%02X", status))
                    end
                    local msg = body:str16(f.message_length, f.message, "message")
                    summary = summary .. " " .. tostring(statuses[status or 0]) .. " \"" .. tostring(msg) .. "\""
                else
                    local key, value = key_value(body)
                    summary = summary .. " key=\"" .. tostring(key) .. "\" " .. tostring(value)
                end
            end
        end
    else -- PROTOCOL.md 4.4
        local major = body:uint(1, f.info_major, "major")
        body:uint(1, f.info_minor)
        local max_body = body:uint(4, f.info_max_body)
        if max_body and not pinfo.visited then
            announced[direction_key(pinfo, true)] = max_body
        end
        if not body.err and body:left() >= 4 then
            local range = tvb(body.pos, 4)
            local item = tree:add(f.info_features, range)
            item:add(f.info_conflation, range)
            item:add(f.info_queries, range)
            item:add(f.info_auth_required, range)
            item:add(f.info_limits, range)
            body.pos = body.pos + 4
        else
            body:fail("features truncated")
        end
        local nm = body:str16(f.info_name_length, f.info_name, "name")
        summary = "INFO \"" .. tostring(nm) .. "\""
        if not body.err and major ~= 1 then
            -- PROTOCOL.md 2: another major version is fatal (MALFORMED), as jetdump says.
            body:fail("protocol major version " .. tostring(major) .. ", not 1")
        end
        if not body.err and body:left() > 0 then
            -- PROTOCOL.md 4.4.1 (1.2): the limits extension; later fields are ignored.
            if body:left() < 6 then
                body:fail(body:left() .. " byte(s) after the name: the limits extension takes 6")
            else
                body:uint(2, f.info_max_key_length, "max_key_length")
                local timeout = body:uint(4, f.info_route_timeout_ms, "route_timeout_ms")
                if timeout and not pinfo.visited and from_daemon(pinfo) ~= false then
                    announced_route_timeout = timeout
                end
                body.pos = body.stop
            end
        end
    end
    body:finish()
    for _, text in ipairs(violations[slot] or {}) do
        tree:add_proto_expert_info(e_violation, text)
    end
    if body.err then
        tree:add(f.malformed, tvb(0, total), body.err)
        tree:add_proto_expert_info(e_malformed, body.err)
        summary = "MALFORMED " .. name .. ": " .. body.err
    end
    tree:append_text(": " .. summary)
    return summary
end

local function frame_length(tvb, pinfo, offset)
    local ftype = tvb(offset, 1):uint()
    local length = tvb(offset + 1, 4):uint()
    if not frame_types[ftype] or length > jet.prefs.max_body then
        -- PROTOCOL.md 9.2: the boundary is lost; take the rest of the segment as one
        -- bad frame instead of asking TCP to reassemble an absurd length.
        return tvb:len() - offset
    end
    return HEADER_SIZE + length
end

-- The Info column lists every frame of a packet; TCP may call the dissector more than
-- once per packet (a reassembled PDU, then the rest of the segment). The text is built
-- on the first pass and set whole on later ones (tshark -2, a click in Wireshark), so
-- that dissecting a packet again never doubles it.
local info_text = {}
local info_frame = -1

local function dissect_pdu(tvb, pinfo, tree)
    pinfo.cols.protocol = "JET"
    local summary = dissect_frame(tvb, pinfo, tree)
    local n = pinfo.number
    if not pinfo.visited then
        if info_frame ~= n then
            info_frame = n
            info_text[n] = summary
        else
            info_text[n] = info_text[n] .. " | " .. summary
        end
    end
    pinfo.cols.info:clear_fence()
    pinfo.cols.info:set(info_text[n] or summary)
    return tvb:len()
end

function jet.dissector(tvb, pinfo, tree)
    local stream = tcp_stream()
    if stream then jet_streams[stream.value] = true end
    check_loss(pinfo) -- before the frames: a response whose request was lost is no violation
    local since = stopped[direction_key(pinfo, true)]
    if since and pinfo.number > since then
        pinfo.cols.protocol = "JET"
        local item = tree:add(jet, tvb())
        item:add_proto_expert_info(e_lost, "not decoded: the frame boundary was lost in frame " .. since)
        pinfo.cols.info:set("[data after lost frame boundary]")
        return tvb:len()
    end
    dissect_tcp_pdus(tvb, tree, HEADER_SIZE, frame_length, dissect_pdu, true)
    return tvb:len()
end

-- PROTOCOL.md 4.4: a daemon's first frame is INFO, major version 1.
local function heuristic(tvb, pinfo, tree)
    if not jet.prefs.heuristic or tvb:len() < 7 then return false end
    if tvb(0, 1):uint() ~= 4 then return false end
    local length = tvb(1, 4):uint()
    if length < 14 or length > 12 + 2 + 65535 or tvb(5, 1):uint() ~= 1 then return false end
    pinfo.conversation = jet
    jet.dissector(tvb, pinfo, tree)
    return true
end

-- Statistics for tshark, as built-in protocols offer them:
--   tshark -q -z jet,srt -r cap     service response time per function (from jet.time)
--   tshark -q -z jet,tree -r cap    frames by type, function, event code and status
local f_rtt = Field.new("jet.rtt_ms")
local f_request_function = Field.new("jet.request_function")
local f_type = Field.new("jet.type")
local f_function = Field.new("jet.function")
local f_code = Field.new("jet.code")
local f_status = Field.new("jet.status")

local function all(extractor)
    local out = {}
    for i, field in ipairs({ extractor() }) do out[i] = field.value end
    return out
end

register_stat_cmd_arg("jet,srt", function()
    local per = {}
    local tap = Listener.new("frame", "jet.rtt_ms")
    function tap.packet()
        local funcs = all(f_request_function)
        for i, rtt in ipairs(all(f_rtt)) do
            local name = functions[funcs[i]] or "?"
            local s = per[name] or { n = 0, sum = 0, min = math.huge, max = 0 }
            s.n, s.sum = s.n + 1, s.sum + rtt
            if rtt < s.min then s.min = rtt end
            if rtt > s.max then s.max = rtt end
            per[name] = s
        end
    end
    function tap.draw()
        print("===================================================================")
        print("jet service response time (seconds, request to response)")
        print(string.format("%-16s %8s %12s %12s %12s %14s", "Function", "Calls", "Min SRT", "Max SRT", "Avg SRT", "Sum SRT"))
        local names = {}
        for name in pairs(per) do names[#names + 1] = name end
        table.sort(names)
        for _, name in ipairs(names) do
            local s = per[name]
            print(string.format("%-16s %8d %12.6f %12.6f %12.6f %14.6f", name, s.n, s.min / 1000, s.max / 1000,
                s.sum / s.n / 1000, s.sum / 1000))
        end
        print("===================================================================")
    end
    function tap.reset() per = {} end
end)

register_stat_cmd_arg("jet,tree", function()
    local counts, total = {}, 0
    local tap = Listener.new("frame", "jet")
    local function count(label)
        counts[label] = (counts[label] or 0) + 1
    end
    function tap.packet()
        local funcs, codes, statuses_seen = all(f_function), all(f_code), all(f_status)
        local fi, ci, si = 1, 1, 1
        for _, ftype in ipairs(all(f_type)) do
            total = total + 1
            local tname = frame_types[ftype] or string.format("0x%02X", ftype)
            count(tname)
            if ftype == 1 and funcs[fi] then
                count(tname .. " / " .. (functions[funcs[fi]] or string.format("0x%02X", funcs[fi])))
                fi = fi + 1
            elseif ftype == 2 and statuses_seen[si] then
                count(tname .. " / " .. (statuses[statuses_seen[si]] or string.format("0x%02X", statuses_seen[si])))
                si = si + 1
            elseif ftype == 3 and codes[ci] then
                local code = codes[ci]
                ci = ci + 1
                local name = event_codes[code] or functions[code] or string.format("0x%02X", code)
                count(tname .. " / " .. name)
            end
        end
    end
    function tap.draw()
        print("===================================================================")
        print("jet frames by type, function, event code and status")
        print(string.format("%-40s %10s %9s", "Topic / Item", "Count", "Percent"))
        print(string.format("%-40s %10d %9s", "jet frames", total, "100.00%"))
        local labels = {}
        for label in pairs(counts) do labels[#labels + 1] = label end
        table.sort(labels)
        for _, label in ipairs(labels) do
            local indent = label:find(" / ") and "    " or "  "
            local shown = label:gsub("^.* / ", "")
            print(string.format("%-40s %10d %8.2f%%", indent .. shown, counts[label], 100 * counts[label] / total))
        end
        print("===================================================================")
    end
    function tap.reset() counts, total = {}, 0 end
end)

local registered_port = 0
function jet.init()
    stopped, requests, answers, answered = {}, {}, {}, {}
    violations, announced = {}, {}
    seqs, gaps, gapped, loss_checked, jet_streams = {}, {}, {}, {}, {}
    info_frame = -1
    info_text = {}
    local tcp_port = DissectorTable.get("tcp.port")
    if registered_port ~= 0 then tcp_port:remove(registered_port, jet) end
    registered_port = jet.prefs.port
    tcp_port:add(registered_port, jet)
end

DissectorTable.get("tcp.port"):add(11124, jet)
registered_port = 11124
jet:register_heuristic("tcp", heuristic)
