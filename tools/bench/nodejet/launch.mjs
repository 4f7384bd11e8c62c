// Start a node-jet 3 daemon on 127.0.0.1 for tools/bench/daemon.py.
//
// usage: node launch.mjs NODE_JET_PREFIX [PORT]
//   NODE_JET_PREFIX  the directory `npm install --prefix` installed node-jet into
//   PORT             TCP port, 0 (the default) for a free one
// Prints "nodejet listening on 127.0.0.1:PORT" once listening; SIGTERM stops it.
import { join } from 'node:path';
import net from 'node:net';
import { pathToFileURL } from 'node:url';

// node-jet 3.0.17 builds a CloseEvent on every TCP disconnect; Node 20 has none, and
// the ReferenceError kills the daemon. It must exist before node-jet is imported.
if (typeof globalThis.CloseEvent === 'undefined') {
  globalThis.CloseEvent = class CloseEvent extends Event {
    constructor(type, init = {}) {
      super(String(type ?? 'close'));
      this.code = init.code ?? 1000;
      this.reason = init.reason ?? '';
      this.wasClean = init.wasClean ?? true;
    }
  };
}

const prefix = process.argv[2];
const wanted = Number(process.argv[3] ?? 0);
if (!prefix) {
  console.error('usage: node launch.mjs NODE_JET_PREFIX [PORT]');
  process.exit(2);
}

// node-jet's TCPServer calls server.listen(tcpPort) with no host, i.e. on every
// interface, and skips TCP entirely for port 0. Bind the one server it creates to
// 127.0.0.1 and the port asked for (0 allowed), and report the real address.
const originalListen = net.Server.prototype.listen;
net.Server.prototype.listen = function listen(...args) {
  if (typeof args[0] === 'number') {
    this.once('listening', () => {
      const { address, port } = this.address();
      process.stdout.write(`nodejet listening on ${address}:${port}\n`);
    });
    return originalListen.call(this, { port: wanted, host: '127.0.0.1' });
  }
  return originalListen.apply(this, args);
};

const jet = await import(pathToFileURL(join(prefix, 'node_modules', 'node-jet', 'lib', 'index.js')).href);
const daemon = new jet.Daemon({ name: 'node-jet-bench' });
// Any truthy tcpPort makes node-jet start its TCP server; the patch above picks the port.
daemon.listen({ tcpPort: 1 });

const stop = () => {
  daemon.close();
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
