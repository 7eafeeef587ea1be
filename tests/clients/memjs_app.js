// memjs (npm) as an application uses it, authenticating with SASL PLAIN over the binary protocol.
//
// Usage: node memjs_app.js HOST:PORT USER PASSWORD against a server that holds no keys yet
// (NODE_PATH names the node_modules holding memjs). Prints `ok NAME` for each check that holds and
// `FAIL NAME: detail` for each that does not, then `done`. memjs has no multi-get and no
// compare-and-swap: its gets are issued together instead, pipelined on one connection.
"use strict";
const crypto = require("crypto");
const memjs = require("memjs");

const [addr, user, password] = process.argv.slice(2);
const options = { timeout: 10, retries: 0, logger: { log() {} } };
const client = memjs.Client.create(`${user}:${password}@${addr}`, options);

function check(name, got, want) {
  const same = Buffer.isBuffer(want) ? Buffer.isBuffer(got) && want.equals(got)
    : JSON.stringify(got) === JSON.stringify(want);
  if (same) {
    console.log(`ok ${name}`);
  } else {
    console.log(`FAIL ${name}: got ${String(JSON.stringify(got)).slice(0, 200)} want ${String(JSON.stringify(want)).slice(0, 200)}`);
  }
}

async function rejects(name, promise, message) {
  try {
    await promise;
    check(name, "accepted", message);
  } catch (err) {
    check(name, err.message, message);
  }
}

async function value(key) {
  return (await client.get(key)).value;
}

async function main() {
  // A wrong password is refused: the command fails instead of being served.
  const intruder = memjs.Client.create(`${user}:wrong@${addr}`, options);
  try {
    await intruder.set("intruder", "x", {});
    check("wrong password refused", "stored", "refused");
  } catch (err) {
    check("wrong password refused", "refused", "refused");
  }
  intruder.close();

  // Values from empty to several MiB, both sides of the 256 KiB RAM head.
  const sizes = [0, 1, 100, 262143, 262144, 262145, 1 << 20, 3 * (1 << 20) + 7];
  const values = new Map(sizes.map((n) => [`size-${n}`, crypto.randomBytes(n)]));
  for (const [key, v] of values) {
    check(`set ${key}`, (await client.set(key, v, {})), true);
  }
  for (const [key, v] of values) {
    check(`get ${key}`, await value(key), v);
  }
  // Many gets in flight at once on one connection, a miss among them.
  const keys = [...values.keys(), "never-set"];
  const got = await Promise.all(keys.map((k) => value(k)));
  check("pipelined gets", got.map((v, i) => (i < values.size ? v.equals(values.get(keys[i])) : v)),
    [...Array(values.size).fill(true), null]);

  await client.set("n", "10", {});
  check("increment", (await client.increment("n", 5, {})).value, 15);
  check("decrement below zero", (await client.decrement("n", 20, {})).value, 0);
  // memjs always sends an initial value, so a missing counter is created with it.
  check("increment creates", (await client.increment("counter", 1, { initial: 7 })).value, 7);
  check("increment created", (await client.increment("counter", 1, {})).value, 8);

  check("touch", await client.touch("n", 100), true);
  check("touch missing", await client.touch("never-set", 100), false);

  // append past the 256 KiB RAM head. (memjs 1.3.2's prepend sends APPEND's opcode, so it
  // appends on every server: not checked here.)
  const a = crypto.randomBytes(200000), b = crypto.randomBytes(100000);
  await client.set("grow", a, {});
  check("append past 256 KiB", await client.append("grow", b), true);
  check("appended value", await value("grow"), Buffer.concat([a, b]));
  const c = crypto.randomBytes(262140);
  await client.set("grow", c, {});
  check("append across 256 KiB", await client.append("grow", "12345"), true);
  check("appended across", await value("grow"), Buffer.concat([c, Buffer.from("12345")]));
  await rejects("append missing", client.append("never-set", "x"), "MemJS APPEND: Item not stored");

  check("add existing", await client.add("n", "1", {}), false);
  check("add new", await client.add("added", "1", {}), true);
  check("replace missing", await client.replace("never-set", "1", {}), false);
  check("delete", await client.delete("added"), true);
  check("delete missing", await client.delete("added"), false);
  check("get deleted", await value("added"), null);
  const stats = await new Promise((resolve, reject) =>
    client.stats((err, server, s) => (err ? reject(err) : resolve(s))));
  check("stats version", stats.version, "1.6.45");
  check("flush", Object.values(await client.flush()), [true]);
  check("after flush", await value("n"), null);
  client.close();
  console.log("done");
}

main().catch((err) => {
  console.log(`FAIL unexpected error: ${err && err.stack}`);
  client.close();
  process.exit(1);
});
