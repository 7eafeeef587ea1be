"""What every client script here prints: `ok NAME` for a check that holds, `FAIL NAME: detail`
for one that does not (tests/common::run_checks reads them)."""


def check(name, got, want):
    if got == want:
        print(f"ok {name}", flush=True)
    else:
        print(f"FAIL {name}: got {got!r:.200} want {want!r:.200}", flush=True)


def raises(name, call, error):
    """`call()` must raise `error`."""
    try:
        call()
        print(f"FAIL {name}: no {error.__name__}", flush=True)
    except error:
        print(f"ok {name}", flush=True)
