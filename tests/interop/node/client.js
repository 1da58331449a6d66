// A RollArt client in another language: loads protos/rollart/v1 with proto-loader (the client is generated from
// the .proto files at run time) and calls the resource manager: health, register a pool and a worker, bind.
// Usage: node client.js HOST:PORT TOKEN   -> prints one JSON line with what it got back.
"use strict";
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const [address, token] = process.argv.slice(2);
if (!address || !token) {
  console.error("usage: node client.js HOST:PORT TOKEN");
  process.exit(2);
}
const root = path.resolve(__dirname, "../../../protos");
const opts = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true, includeDirs: [root] };
const rollart = grpc.loadPackageDefinition(protoLoader.loadSync("rollart/v1/resource_manager.proto", opts)).rollart.v1;
const healthProto = protoLoader.loadSync(path.join(__dirname, "health.proto"), opts);
const health = grpc.loadPackageDefinition(healthProto).grpc.health.v1;

const creds = grpc.credentials.createInsecure();
const rm = new rollart.ResourceManager(address, creds);
const hc = new health.Health(address, creds);
const md = new grpc.Metadata();
md.set("authorization", `Bearer ${token}`);
const deadline = () => ({ deadline: new Date(Date.now() + 10000) });
const call = (client, method, req, meta) =>
  new Promise((resolve, reject) =>
    meta
      ? client[method](req, meta, deadline(), (err, res) => (err ? reject(err) : resolve(res)))
      : client[method](req, deadline(), (err, res) => (err ? reject(err) : resolve(res))),
  );

(async () => {
  const out = {};
  out.health = (await call(hc, "Check", { service: "rollart.v1.ResourceManager" })).status;
  try {
    await call(rm, "ListPools", {}, new grpc.Metadata());
    out.unauthenticated = "NOT REJECTED";
  } catch (err) {
    out.unauthenticated = grpc.status[err.code];
  }
  const pool = await call(rm, "RegisterPool",
    { pool: { name: "node-pool", kind: "POOL_KIND_CPU", capacity: 2, region: "js" } }, md);
  out.pool = { name: pool.name, kind: pool.kind, up: pool.up };
  const reg = await call(rm, "RegisterWorker", {
    worker: { worker_id: "node-worker", role: "env", endpoint: "127.0.0.1:1", pool: "node-pool", ttl_seconds: 30,
      hardware: { accelerator: "cpu", count: 1, tags: ["js"] } },
  }, md);
  out.worker = { id: reg.worker.worker_id, state: reg.worker.state, region: reg.worker.region };
  const binding = await call(rm, "Bind",
    { binding_id: "node-binding", role: "env", replicas: 1, preferred_pool: "node-pool" }, md);
  out.binding = { id: binding.binding_id, workers: binding.workers.map((w) => w.worker_id), degraded: binding.degraded };
  console.log(JSON.stringify(out));
  rm.close();
  hc.close();
})().catch((err) => {
  console.error(`error: ${err.message}`);
  process.exit(1);
});
