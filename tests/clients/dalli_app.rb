# dalli (Debian's ruby-dalli, the binary protocol) as an application uses it.
#
# Usage: ruby dalli_app.rb HOST:PORT[,HOST:PORT...] against servers that hold no keys yet.
# Prints `ok NAME` for each check that holds and `FAIL NAME: detail` for each that does not, then
# `done`.
require "dalli"

servers = ARGV[0].split(",")
options = { value_max_bytes: 8 << 20, compress: false, socket_timeout: 10, socket_max_failures: 0 }
dc = Dalli::Client.new(servers, options)
other = Dalli::Client.new(servers, options)
rng = Random.new(17)
RAW = { raw: true }.freeze

def check(name, got, want)
  if got == want
    puts "ok #{name}"
  else
    puts "FAIL #{name}: got #{got.inspect[0, 200]} want #{want.inspect[0, 200]}"
  end
  $stdout.flush
end

# Values from empty to several MiB, both sides of the 256 KiB RAM head, stored raw.
sizes = [0, 1, 100, 262_143, 262_144, 262_145, 1 << 20, 3 * (1 << 20) + 7]
values = sizes.to_h { |n| ["size-#{n}", rng.bytes(n)] }
values.each { |k, v| dc.set(k, v, nil, RAW) }
check("get every size", values.select { |k, v| dc.get(k, RAW) == v }.keys, values.keys)
# Ruby objects through dalli's default serializer (Marshal): the flags must round-trip.
objects = { "sym" => :sym, "hash" => { "k" => [1, 2.5, nil] }, "utf8" => "grüße" }
objects.each { |k, v| dc.set(k, v) }
check("typed round-trip", objects.keys.map { |k| dc.get(k) }, objects.values)
batch = (0...50).to_h { |i| ["batch-#{i}", rng.bytes(rng.rand(3000))] }
batch.each { |k, v| dc.set(k, v, nil, RAW) }
check("get_multi", dc.get_multi(*batch.keys, "never-set"), batch)

dc.set("cas", "first", nil, RAW)
value, token = dc.get_cas("cas")
check("get_cas", [value, token.positive?], ["first", true])
other.set("cas", "newer", nil, RAW) # another writer gets in first
check("cas stale write refused", dc.set_cas("cas", "stale", token, nil, RAW), false)
check("newer value kept", dc.get("cas", RAW), "newer")
value, token = dc.get_cas("cas")
check("cas current", dc.set_cas("cas", "mine", token, nil, RAW).is_a?(Integer), true)
check("cas value", dc.get("cas", RAW), "mine")
check("cas block", dc.cas("cas") { |v| v + "!" }.is_a?(Integer), true)
check("cas block value", dc.get("cas"), "mine!")
check("cas missing", dc.cas("never-set") { |v| v }, nil)

dc.set("n", "10", nil, RAW)
check("incr", dc.incr("n", 5), 15)
check("decr below zero", dc.decr("n", 20), 0)
check("incr missing", dc.incr("never-set", 1), nil)
check("incr with default", dc.incr("counter", 1, nil, 7), 7)
check("incr to max", dc.incr("n", (2**64) - 1), (2**64) - 1)
check("incr wraps", dc.incr("n", 1), 0)

check("touch", dc.touch("n", 100), true)
check("touch missing", dc.touch("never-set", 100), nil)

# append and prepend past the 256 KiB RAM head.
a = rng.bytes(200_000)
b = rng.bytes(100_000)
dc.set("grow", a, nil, RAW)
check("append past 256 KiB", dc.append("grow", b), true)
check("appended value", dc.get("grow", RAW) == a + b, true)
a = rng.bytes(262_140)
dc.set("grow", a, nil, RAW)
check("prepend past 256 KiB", dc.prepend("grow", "12345"), true)
check("prepended value", dc.get("grow", RAW) == "12345".b + a, true)
big = "size-#{3 * (1 << 20) + 7}"
check("append to a 3 MiB value", dc.append(big, "tail"), true)
check("appended 3 MiB value", dc.get(big, RAW) == values[big] + "tail", true)
check("append missing", dc.append("never-set", "x"), false)

check("add existing", dc.add("n", "1", nil, RAW), false)
check("add new", dc.add("added", "1", nil, RAW).is_a?(Integer), true)
# dalli answers a miss with the reply's CAS (0) for replace, and nil for delete.
check("replace missing", dc.replace("never-set", "1", nil, RAW), 0)
check("delete", dc.delete("added"), true)
check("delete missing", dc.delete("added"), nil)
check("get deleted", dc.get("added"), nil)
check("version", dc.version.values.uniq, ["1.6.45"])
dc.flush
check("after flush", dc.get_multi("n", "batch-0", "sym"), {})
dc.close
other.close
puts "done"
