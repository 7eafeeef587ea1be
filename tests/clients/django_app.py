"""Django's two memcached cache backends as a Django application uses them.

Usage: django_app.py pymemcache|pylibmc HOST:PORT[,HOST:PORT...] against servers that hold no
keys yet. Prints `ok NAME` for each check that holds and `FAIL NAME: detail` for each that does
not, then `done`. Django's cache API has no compare-and-swap, append or prepend: those are checked
with the client libraries themselves (pymemcache, pylibmc).
"""
import random
import sys

import django
from django.conf import settings

from checks import check

backend = {
    "pymemcache": "django.core.cache.backends.memcached.PyMemcacheCache",
    "pylibmc": "django.core.cache.backends.memcached.PyLibMCCache",
}[sys.argv[1]]
settings.configure(
    CACHES={"default": {"BACKEND": backend, "LOCATION": sys.argv[2].split(","), "TIMEOUT": None}}
)
django.setup()
from django.core.cache import cache  # noqa: E402 (needs the settings above)

rng = random.Random(13)


# Django pickles what it stores: values from empty to several MiB, and typed objects.
sizes = [0, 1, 100, 262143, 262144, 262145, 1 << 20, 3 * (1 << 20) + 7]
values = {f"size-{n}": rng.randbytes(n) for n in sizes}
for key, value in values.items():
    cache.set(key, value)
check("get every size", [k for k, v in values.items() if cache.get(k) == v], list(values))
objects = {"str": "grüße", "int": 42, "dict": {"k": [1, 2.5, None]}, "list": list(range(1000))}
check("set_many", cache.set_many(objects), [])
check("get_many", cache.get_many(list(objects) + ["never-set"]), objects)
check("get default", cache.get("never-set", "fallback"), "fallback")
check("get_or_set", cache.get_or_set("computed", lambda: "made once"), "made once")
check("get_or_set kept", cache.get_or_set("computed", lambda: "made twice"), "made once")

check("add new", cache.add("added", 1), True)
check("add existing", cache.add("added", 2), False)
check("added value", cache.get("added"), 1)

cache.set("n", 10)
check("incr", cache.incr("n", 5), 15)
check("decr", cache.decr("n", 3), 12)
check("decr below zero", cache.decr("n", 20), 0)
try:
    cache.incr("never-set")
    check("incr missing", "no error", "ValueError")
except ValueError:
    check("incr missing", "ValueError", "ValueError")

check("touch", cache.touch("n", 100), True)
check("touch missing", cache.touch("never-set", 100), False)
check("has_key", (cache.has_key("n"), cache.has_key("never-set")), (True, False))

# A timeout of 1 s: gone once it has passed (memcached counts whole seconds).
cache.set("short", "v", timeout=1)
check("short-lived present", cache.get("short"), "v")
import time  # noqa: E402

time.sleep(2.1)
check("short-lived expired", cache.get("short"), None)

# Versioned keys, as Django's cache versioning uses them.
cache.set("versioned", "v1", version=1)
cache.set("versioned", "v2", version=2)
check("versions", (cache.get("versioned", version=1), cache.get("versioned", version=2)),
      ("v1", "v2"))
check("incr_version", cache.incr_version("versioned", version=2), 3)
check("after incr_version", cache.get("versioned", version=3), "v2")

check("delete", cache.delete("added"), True)
check("delete missing", cache.delete("added"), False)
cache.delete_many(["str", "int"])
check("delete_many", cache.get_many(["str", "int", "dict"]), {"dict": objects["dict"]})
cache.clear()
check("clear", cache.get_many(list(values) + ["dict", "n"]), {})
cache.close()
print("done")
