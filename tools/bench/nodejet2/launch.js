// Start a node-jet 2 daemon (sorted fetches) on 127.0.0.1 for tools/bench/queries.py.
//
// usage: node launch.js NODE_JET_PREFIX [PORT]
//   NODE_JET_PREFIX  the directory `npm install --prefix` installed node-jet@2.1.2 into
//   PORT             TCP port, 0 (the default) for a free one
// Prints "nodejet2 listening on 127.0.0.1:PORT" once listening; SIGTERM stops it.
'use strict'
const path = require('path')
const net = require('net')

const prefix = process.argv[2]
const wanted = Number(process.argv[3] || 0)
if (!prefix) {
  console.error('usage: node launch.js NODE_JET_PREFIX [PORT]')
  process.exit(2)
}

// node-jet 2 listens with server.listen(tcpPort): every interface. Bind 127.0.0.1 and
// the port asked for (0 allowed) instead, and report the real address.
const originalListen = net.Server.prototype.listen
net.Server.prototype.listen = function listen (...args) {
  if (typeof args[0] === 'number') {
    this.once('listening', () => {
      const { address, port } = this.address()
      process.stdout.write(`nodejet2 listening on ${address}:${port}\n`)
    })
    return originalListen.call(this, { port: wanted, host: '127.0.0.1' })
  }
  return originalListen.apply(this, args)
}

const jet = require(path.join(prefix, 'node_modules', 'node-jet'))
const daemon = new jet.Daemon({ name: 'node-jet2-bench', features: { fetch: 'full' } })
daemon.listen({ tcpPort: 1 }) // any truthy port starts TCP; the patch above picks the port

const stop = () => process.exit(0)
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
