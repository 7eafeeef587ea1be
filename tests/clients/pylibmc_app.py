"""pylibmc (libmemcached) as an application uses it, over the binary or the text protocol.

Usage: pylibmc_app.py binary|text HOST:PORT[,HOST:PORT...] against servers that hold no keys yet
Prints `ok NAME` for each check that holds and `FAIL NAME: detail` for each that does not,
then `done`. With more than one server, keys are spread by ketama (consistent hashing).
"""
import random
import sys

import pylibmc

from checks import check, raises

protocol, servers = sys.argv[1], sys.argv[2].split(",")
behaviors = {"cas": True, "ketama": True, "tcp_nodelay": True}
c = pylibmc.Client(servers, binary=(protocol == "binary"), behaviors=behaviors)
other = pylibmc.Client(servers, binary=(protocol == "binary"), behaviors=behaviors)
rng = random.Random(11)


# Values from empty to several MiB, both sides of the 256 KiB RAM head.
sizes = [0, 1, 100, 262143, 262144, 262145, 1 << 20, 3 * (1 << 20) + 7]
values = {f"size-{n}": rng.randbytes(n) for n in sizes}
stored = [k for k, v in values.items() if c.set(k, v)]
check("set every size", stored, list(values))
check("get every size", [k for k, v in values.items() if c.get(k) == v], list(values))

batch = {f"batch-{i}": rng.randbytes(rng.randrange(0, 3000)) for i in range(50)}
check("set_multi", c.set_multi(batch), [])
check("get_multi", c.get_multi(list(batch) + ["never-set"]), batch)

c.set("cas", b"first")
value, token = c.gets("cas")
check("gets", (value, token > 0), (b"first", True))
other.set("cas", b"newer")  # another writer gets in first
check("cas stale write refused", c.cas("cas", b"stale", token), False)
check("newer value kept", c.get("cas"), b"newer")
value, token = c.gets("cas")
check("cas current", c.cas("cas", b"mine", token), True)
check("cas value", c.get("cas"), b"mine")
raises("cas missing", lambda: c.cas("never-set", b"x", token), pylibmc.NotFound)

c.set("n", b"10")
check("incr", c.incr("n", 5), 15)
check("decr below zero", c.decr("n", 20), 0)
c.set("n", b"18446744073709551614")  # pylibmc's deltas are C ints: start near the top
check("incr to max", c.incr("n", 1), 2**64 - 1)
check("incr wraps", c.incr("n", 1), 0)
raises("incr missing", lambda: c.incr("never-set", 1), pylibmc.NotFound)

check("touch", c.touch("n", 100), True)
check("touch missing", c.touch("never-set", 100), False)

# append and prepend past the 256 KiB RAM head.
a, b = rng.randbytes(200_000), rng.randbytes(100_000)
c.set("grow", a)
check("append past 256 KiB", c.append("grow", b), True)
check("appended value", c.get("grow") == a + b, True)
a = rng.randbytes(262_140)
c.set("grow", a)
check("prepend past 256 KiB", c.prepend("grow", b"12345"), True)
check("prepended value", c.get("grow") == b"12345" + a, True)
big = values[f"size-{3 * (1 << 20) + 7}"]
check("append to a 3 MiB value", c.append(f"size-{len(big)}", b"tail"), True)
check("appended 3 MiB value", c.get(f"size-{len(big)}") == big + b"tail", True)
check("append missing", c.append("never-set", b"x"), False)

check("add existing", c.add("n", b"1"), False)
check("add new", c.add("added", b"1"), True)
def replace_missing():
    try:
        return c.replace("never-set", b"1")
    except pylibmc.NotFound:  # libmemcached's binary protocol reports the miss as an error
        return False


check("replace missing", replace_missing(), False)
check("delete", c.delete("added"), True)
check("delete missing", c.delete("added"), False)
check("get deleted", c.get("added"), None)
check("delete_multi", c.delete_multi(["batch-0", "batch-1"]), True)
check("deleted multi", c.get_multi(["batch-0", "batch-1"]), {})
print("done")
