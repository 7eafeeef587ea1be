"""pymemcache through memcached's proxy, as an application in front of several servers uses it.

Usage: proxy_app.py fill|after HOST:PORT
  fill:  stores 500 small values and three of 3 MiB through the proxy, then reads them back
         (one by one, get_many, a multi-get with the large values among small ones), and checks
         gets/cas with a stale token, incr/decr, touch, append and delete;
  after: reads every value back after a backend was restarted: each is the value stored or a
         miss, never other bytes; then stores them all again and reads them back.
Values are drawn from a fixed seed, so both phases know them. Prints `ok NAME` for each check
that holds and `FAIL NAME: detail` for each that does not, then `done`.
"""
import random
import sys

from pymemcache.client.base import Client

from checks import check

phase, addr = sys.argv[1], sys.argv[2]
host, port = addr.rsplit(":", 1)
# default_noreply=False: every store waits for its reply (through a proxy, a noreply store that
# fails still answers, and would be read as the next command's reply).
c = Client((host, int(port)), connect_timeout=5, timeout=10, default_noreply=False)
rng = random.Random(23)
small = {f"key-{i}": rng.randbytes(rng.randrange(1, 2000)) for i in range(500)}
large = {f"big-{i}": rng.randbytes(3 << 20) for i in range(3)}


def store_and_read_all():
    check("set 500 small", [k for k, v in small.items() if not c.set(k, v)], [])
    check("set 3 MiB", [k for k, v in large.items() if not c.set(k, v)], [])
    check("get each", [k for k, v in {**small, **large}.items() if c.get(k) != v], [])
    check("get_many 500", c.get_many(list(small)) == small, True)
    keys = ["key-0", "big-0", "key-1", "never-set", "big-2", "key-499"]
    want = {k: v for k, v in {**small, **large}.items() if k in keys}
    check("get_many with large values among small", c.get_many(keys) == want, True)


if phase == "fill":
    store_and_read_all()
    value, token = c.gets("key-7")
    check("gets", value, small["key-7"])
    check("set by another writer", c.set("key-7", b"newer"), True)
    check("cas stale write refused", c.cas("key-7", b"stale", token), False)
    check("newer value kept", c.get("key-7"), b"newer")
    _, token = c.gets("key-7")
    check("cas current", c.cas("key-7", small["key-7"], token), True)
    c.set("counter", b"10")
    check("incr", c.incr("counter", 5), 15)
    check("append", c.append("counter", b"0"), True)
    check("appended", c.get("counter"), b"150")
    check("decr", c.decr("counter", 200), 0)
    check("touch", c.touch("counter", 100), True)
    check("delete", c.delete("counter"), True)
    check("deleted", c.get("counter"), None)
elif phase == "after":
    got = c.get_many(list(small) + list(large))
    every = {**small, **large}
    check("nothing wrong served", [k for k, v in got.items() if v != every[k]], [])
    print(f"# {len(got)} of {len(every)} values still there", flush=True)
    store_and_read_all()
else:
    sys.exit(f"unknown phase {phase}")
print("done")
