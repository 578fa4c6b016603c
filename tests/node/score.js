// Calls the verifier's Score the way a Node user would: @grpc/grpc-js with the .proto loaded at
// run time. DEADLINE_S: "none" (no deadline), or seconds from now; a huge one makes grpc-js send
// the largest grpc-timeout header (99999999H, about 3.6e11 s). Prints the response as JSON on
// stdout, or {"error": code, "details": ...}.
// Usage: node score.js HOST:PORT PROTO_FILE ITEMS_JSON DEADLINE_S
"use strict";
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const [addr, protoFile, itemsJson, deadlineS] = process.argv.slice(2);
const def = protoLoader.loadSync(protoFile, { keepCase: true, longs: Number, enums: String });
const pkg = grpc.loadPackageDefinition(def);
const client = new pkg.verifier.v1.Verifier(addr, grpc.credentials.createInsecure());
const options = {};
if (deadlineS && deadlineS !== "none") {
  options.deadline = new Date(Math.min(Date.now() + Number(deadlineS) * 1000, 8.64e15));
}
client.Score({ items: JSON.parse(itemsJson) }, options, (err, resp) => {
  if (err) {
    console.log(JSON.stringify({ error: err.code, details: err.details }));
  } else {
    console.log(JSON.stringify(resp));
  }
  client.close();
});
