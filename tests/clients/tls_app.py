"""pymemcache over TLS, as an application with a TLS context uses it.

Usage: tls_app.py PHASE HOST:PORT CA [CERT KEY]
  app:     values of 0 B to 5 MiB, multi-get, gets/cas, incr, delete over TLS;
  refused: a TLS client (with CERT and KEY if given) must not be served: the handshake or its
           first command fails;
  coalesced: its first requests in the same write as the end of its handshake;
  stall:   asks for 200 MiB of replies, never reads them, and waits a minute;
  slow:    reads large values (64 KiB to 5 MiB) in small pieces with pauses, so the server's
           socket buffer fills in the middle of each reply, and checks every byte;
  serial:  prints the server certificate's serial, as a note;
  resumed, not-resumed: connects twice on TLS 1.2 and on TLS 1.3, offering the first
           connection's session the second time, and checks the server resumed it, or not;
  resume-elsewhere: takes a session here and offers it to $TLS_ELSEWHERE (HOST:PORT), which
           must not serve this client (it asks for a certificate this client lacks).
Prints `ok NAME` for each check that holds and `FAIL NAME: detail` for each that does not,
then `done`.
"""
import os
import random
import ssl
import sys

from pymemcache.client.base import Client

from checks import check

phase, addr, ca = sys.argv[1], sys.argv[2], sys.argv[3]
host, port = addr.rsplit(":", 1)
context = ssl.create_default_context(cafile=ca)
if len(sys.argv) > 5:
    context.load_cert_chain(sys.argv[4], sys.argv[5])


def client():
    return Client((host, int(port)), tls_context=context, connect_timeout=5, timeout=10,
                  default_noreply=False)


if phase == "app":
    c = client()
    rng = random.Random(29)
    sizes = [0, 1, 100, 16383, 16384, 16385, 262144, 1 << 20, 5 * (1 << 20) + 3]
    values = {f"size-{n}": rng.randbytes(n) for n in sizes}
    check("set every size", [k for k, v in values.items() if not c.set(k, v)], [])
    check("get every size", [k for k, v in values.items() if c.get(k) != v], [])
    batch = {f"batch-{i}": os.urandom(rng.randrange(1, 3000)) for i in range(300)}
    check("set_many", c.set_many(batch), [])
    check("get_many", c.get_many(list(batch) + list(values)) == {**batch, **values}, True)
    value, token = c.gets("batch-1")
    check("cas stale", c.cas("batch-1", b"x", int(token) + 1), False)
    check("cas current", c.cas("batch-1", b"y", token), True)
    c.set("n", b"41")
    check("incr", c.incr("n", 1), 42)
    check("delete", c.delete("n"), True)
    check("version", c.version(), b"1.6.45")
    c.close()
    # Fresh connections that store at once: the client's first records often come in the
    # same read as the end of its handshake (a session lost them once).
    fresh_failed = []
    for i in range(20):
        fresh = client()
        value = rng.randbytes(300_000)
        try:
            if not fresh.set(f"fresh-{i}", value) or fresh.get(f"fresh-{i}") != value:
                fresh_failed.append(i)
        except Exception as err:
            fresh_failed.append((i, type(err).__name__))
        fresh.close()
    check("fresh connections storing at once", fresh_failed, [])
elif phase == "refused":
    try:
        c = client()
        got = c.version()
        check("refused", f"served: {got!r}", "refused")
    except (ssl.SSLError, OSError, Exception) as err:  # the handshake, or the first read
        print(f"# refused: {type(err).__name__}: {err}", flush=True)
        check("refused", "refused", "refused")
elif phase == "coalesced":
    # The client's last handshake flight and its first request leave in one write, so the
    # server's read that ends the handshake brings the request too (memtier's OpenSSL does
    # this; a session once waited for a request it had already decrypted).
    import socket
    raw = socket.create_connection((host, int(port)), timeout=10)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            if outgoing.pending:
                raw.sendall(outgoing.read())
            data = raw.recv(65536)
            if not data:
                raise SystemExit("closed during the handshake")
            incoming.write(data)
    tls.write(b"set coalesced 0 0 5\r\nhello\r\nget coalesced\r\n")
    raw.sendall(outgoing.read())  # Finished (TLS 1.3) and the requests, together
    got = b""
    while not got.endswith(b"END\r\n"):
        try:
            got += tls.read(65536)
        except ssl.SSLWantReadError:
            data = raw.recv(65536)
            if not data:
                break
            incoming.write(data)
    check("requests sent with the handshake's end", got,
          b"STORED\r\nVALUE coalesced 0 5\r\nhello\r\nEND\r\n")
elif phase == "stall":
    # Asks for far more than the socket buffers hold, never reads, and waits to be cut off.
    import socket, time
    c = client()
    c.set("big", os.urandom(5 << 20))
    c.close()
    raw = socket.create_connection((host, int(port)), timeout=60)
    tls = context.wrap_socket(raw, server_hostname="localhost")
    tls.sendall(b"get big\r\n" * 40)
    print("# sent", flush=True)
    time.sleep(60)
elif phase == "slow":
    import socket, time
    c = client()
    rng = random.Random(31)
    sizes = [65536, 65537, 262144 + 5, 5 * (1 << 20) + 1]
    values = {f"slow-{n}": rng.randbytes(n) for n in sizes}
    check("set the large values", [k for k, v in values.items() if not c.set(k, v)], [])
    c.close()
    raw = socket.create_connection((host, int(port)), timeout=20)
    tls = context.wrap_socket(raw, server_hostname="localhost")
    keys = list(values) * 2
    tls.sendall(b"".join(f"get {k}\r\n".encode() for k in keys))
    want = b"".join(b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (k.encode(), len(values[k]), values[k])
                    for k in keys)
    got = bytearray()
    while len(got) < len(want):
        data = tls.recv(4096)
        if not data:
            break
        got += data
        # A pause every 256 KiB: the server finds the socket full many times a reply.
        if len(got) % (256 << 10) < 4096:
            time.sleep(0.02)
    check("every byte of each large value, read slowly", bytes(got) == want, True)
    tls.close()
elif phase == "serial":
    import socket
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
            print(f"# peer certificate: {len(der)} bytes", flush=True)
            print(f"# serial {tls.getpeercert()['serialNumber']}", flush=True)
    check("handshake", True, True)
elif phase in ("resumed", "not-resumed", "resume-elsewhere"):
    import socket

    def session_of(version, at, session=None):
        """A TLS connection to `at` offering `session`: whether it was resumed, and the
        session it leaves (a TLS 1.3 server sends it after the handshake, so a request is
        answered first)."""
        h, p = at.rsplit(":", 1)
        with socket.create_connection((h, int(p)), timeout=10) as raw:
            with versioned[version].wrap_socket(raw, server_hostname="localhost",
                                                session=session) as tls:
                tls.sendall(b"version\r\n")
                reply = tls.recv(100)
                if not reply.startswith(b"VERSION"):
                    raise SystemExit(f"no VERSION reply: {reply!r}")
                return tls.session_reused, tls.session

    versioned = {}
    for name, version in (("TLSv1.2", ssl.TLSVersion.TLSv1_2), ("TLSv1.3", ssl.TLSVersion.TLSv1_3)):
        ctx = ssl.create_default_context(cafile=ca)
        ctx.minimum_version = ctx.maximum_version = version
        versioned[name] = ctx
    for name in versioned:
        _, session = session_of(name, addr)
        if phase == "resume-elsewhere":
            try:
                session_of(name, os.environ["TLS_ELSEWHERE"], session)
                check(f"{name} session refused elsewhere", "served", "refused")
            except (ssl.SSLError, OSError, SystemExit) as err:
                print(f"# {name} elsewhere: {type(err).__name__}: {err}", flush=True)
                check(f"{name} session refused elsewhere", "refused", "refused")
            continue
        reused, _ = session_of(name, addr, session)
        check(f"{name} session resumed", reused, phase == "resumed")
else:
    sys.exit(f"unknown phase {phase}")
print("done")
