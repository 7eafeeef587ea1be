/*
 * floor: the kernel-TCP floor of a memcached binary-protocol server on this machine.
 *
 * A responder with no store. Every GET-family request (GET 0x00, GETQ 0x09, GETK 0x0c,
 * GETKQ 0x0d) is answered as a hit with a fixed 32-byte value and fixed flags (GETK and GETKQ
 * echo the key, as the protocol asks); quiet mutations (SETQ, ADDQ, REPLACEQ, DELETEQ,
 * INCREMENTQ, DECREMENTQ, FLUSHQ, APPENDQ, PREPENDQ) get no reply, as a quiet command that
 * succeeded gets none; QUITQ closes without a reply, QUIT after its reply; every other request
 * gets an empty success reply carrying the request's opcode and opaque.
 *
 * It talks to the kernel the way memcached does: one epoll loop per thread, each thread with its
 * own SO_REUSEPORT listener, nonblocking sockets with TCP_NODELAY, and per readable event one
 * read() and one write() answering every complete frame that read completed. A server that does
 * real work cannot cost less CPU per request than this without changing how it talks to the
 * kernel (batching across connections, io_uring).
 *
 * Usage:  floor PORT THREADS [ADDR]      (ADDR defaults to 127.0.0.1; numeric IPv4 or IPv6)
 * Build:  cc -O2 -Wall -Wextra -o floor floor.c -lpthread
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

enum {
    HEADER_BYTES = 24,
    VALUE_BYTES = 32,
    FLAGS_BYTES = 4,
    IN_CAPACITY = 64 * 1024,
    /* A reply is at most a request plus 36 bytes (flags and value) and requests are at least
     * 24 bytes, so four times the input always holds the replies to one buffer of requests. */
    OUT_CAPACITY = 4 * IN_CAPACITY,
    MAX_EVENTS = 256,
};

static const uint32_t FLAGS = 0;
static const char VALUE[VALUE_BYTES + 1] = "floor-responder-fixed-value-32by";

struct conn {
    int fd;
    size_t in_len;         /* bytes buffered in `in` */
    uint64_t skip_bytes;   /* body bytes of an oversized frame still to discard */
    size_t pending_len;    /* reply bytes the socket did not take yet */
    size_t pending_off;
    unsigned char *pending;
    unsigned char in[IN_CAPACITY];
};

struct worker {
    int listen_fd;
    int epoll_fd;
    unsigned char out[OUT_CAPACITY];
};

static int is_get(unsigned char op) { return op == 0x00 || op == 0x09 || op == 0x0c || op == 0x0d; }
static int echoes_key(unsigned char op) { return op == 0x0c || op == 0x0d; }
static int is_quiet_mutation(unsigned char op) {
    return (op >= 0x11 && op <= 0x16) || op == 0x18 || op == 0x19 || op == 0x1a;
}

static uint16_t load16(const unsigned char *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t load32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static void store16(unsigned char *p, uint16_t v) { p[0] = v >> 8; p[1] = v & 0xff; }
static void store32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = (v >> 16) & 0xff; p[2] = (v >> 8) & 0xff; p[3] = v & 0xff;
}

/* Writes the reply to the request header `h` (whose key follows its extras) at `out`; returns
 * its length, 0 for no reply. */
static size_t reply(const unsigned char *h, unsigned char *out) {
    unsigned char op = h[1];
    if (is_quiet_mutation(op) || op == 0x17) return 0;
    memset(out, 0, HEADER_BYTES);
    out[0] = 0x81;
    out[1] = op;
    memcpy(out + 12, h + 12, 4); /* opaque */
    if (!is_get(op)) return HEADER_BYTES;
    uint16_t key_len = echoes_key(op) ? load16(h + 2) : 0;
    out[4] = FLAGS_BYTES;
    store16(out + 2, key_len);
    store32(out + 8, FLAGS_BYTES + key_len + VALUE_BYTES);
    out[23] = 1; /* CAS */
    unsigned char *p = out + HEADER_BYTES;
    store32(p, FLAGS);
    p += FLAGS_BYTES;
    memcpy(p, h + HEADER_BYTES + h[4], key_len);
    p += key_len;
    memcpy(p, VALUE, VALUE_BYTES);
    return HEADER_BYTES + FLAGS_BYTES + key_len + VALUE_BYTES;
}

static void close_conn(struct conn *c) {
    close(c->fd);
    free(c->pending);
    free(c);
}

static int watch(struct worker *w, struct conn *c, int op, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.ptr = c};
    return epoll_ctl(w->epoll_fd, op, c->fd, &ev);
}

/* Sends `len` bytes of `out`; what the socket does not take waits in the connection, which
 * then stops reading until it is sent. Returns -1 when the connection is gone. */
static int send_replies(struct worker *w, struct conn *c, const unsigned char *out, size_t len) {
    ssize_t n = write(c->fd, out, len);
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        n = 0;
    }
    if ((size_t)n == len) return 0;
    c->pending = malloc(len - n);
    if (!c->pending) return -1;
    memcpy(c->pending, out + n, len - n);
    c->pending_len = len - n;
    c->pending_off = 0;
    return watch(w, c, EPOLL_CTL_MOD, EPOLLOUT);
}

static int flush_pending(struct worker *w, struct conn *c) {
    ssize_t n = write(c->fd, c->pending + c->pending_off, c->pending_len - c->pending_off);
    if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
    c->pending_off += n;
    if (c->pending_off < c->pending_len) return 0;
    free(c->pending);
    c->pending = NULL;
    c->pending_len = c->pending_off = 0;
    return watch(w, c, EPOLL_CTL_MOD, EPOLLIN);
}

/* One read, then one write answering every complete frame. Returns -1 to close. */
static int on_readable(struct worker *w, struct conn *c) {
    ssize_t n = read(c->fd, c->in + c->in_len, IN_CAPACITY - c->in_len);
    if (n == 0) return -1;
    if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
    c->in_len += n;
    if (c->skip_bytes) { /* the rest of an oversized frame's body: only the buffer held it */
        size_t dropped = c->skip_bytes < c->in_len ? c->skip_bytes : c->in_len;
        memmove(c->in, c->in + dropped, c->in_len - dropped);
        c->in_len -= dropped;
        c->skip_bytes -= dropped;
    }
    size_t off = 0, out_len = 0;
    int quit = 0;
    while (!quit && c->in_len - off >= HEADER_BYTES) {
        const unsigned char *h = c->in + off;
        uint64_t body = load32(h + 8);
        size_t prefix = HEADER_BYTES + h[4] + load16(h + 2); /* header, extras, key */
        if (h[0] != 0x80 || prefix > HEADER_BYTES + body || prefix > IN_CAPACITY) return -1;
        uint64_t frame = HEADER_BYTES + body;
        size_t avail = c->in_len - off;
        if (avail < frame) {
            if (frame <= IN_CAPACITY || avail < prefix) break; /* the rest comes in later reads */
            /* Too large to buffer (a big SET): answer from its header and key, drop its body. */
            out_len += reply(h, w->out + out_len);
            c->skip_bytes = frame - avail;
            off = c->in_len;
            break;
        }
        out_len += reply(h, w->out + out_len);
        quit = h[1] == 0x07 || h[1] == 0x17;
        off += frame;
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    if (out_len && send_replies(w, c, w->out, out_len) < 0) return -1;
    return quit ? -1 : 0;
}

static void accept_all(struct worker *w) {
    int one = 1;
    for (;;) {
        int fd = accept4(w->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN, or an aborted connection: nothing more to take now */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *c = calloc(1, sizeof *c);
        if (!c) { close(fd); continue; }
        c->fd = fd;
        if (watch(w, c, EPOLL_CTL_ADD, EPOLLIN) < 0) close_conn(c);
    }
}

static void *serve(void *arg) {
    struct worker *w = arg;
    struct epoll_event events[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(w->epoll_fd, events, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("epoll_wait");
            exit(1);
        }
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            if (!c) { accept_all(w); continue; }
            int status = c->pending ? flush_pending(w, c) : on_readable(w, c);
            if (status < 0 || (events[i].events & EPOLLERR)) close_conn(c);
        }
    }
    return NULL;
}

static int open_listener(const struct addrinfo *ai) {
    int one = 1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 1024) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s PORT THREADS [ADDR]\n", argv[0]);
        return 2;
    }
    const char *port = argv[1];
    int threads = atoi(argv[2]);
    const char *addr = argc == 4 ? argv[3] : "127.0.0.1";
    if (threads < 1 || atoi(port) < 1 || atoi(port) > 65535) {
        fprintf(stderr, "floor: PORT must be 1-65535 and THREADS at least 1\n");
        return 2;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *ai;
    int rc = getaddrinfo(addr, port, &hints, &ai);
    if (rc) {
        fprintf(stderr, "floor: %s: %s\n", addr, gai_strerror(rc));
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    /* Every listener is bound before any thread serves, so a bad address fails at once. */
    struct worker **workers = calloc(threads, sizeof *workers);
    for (int i = 0; i < threads; i++) {
        struct worker *w = workers[i] = calloc(1, sizeof *w);
        if (!w) { perror("floor: calloc"); return 1; }
        w->listen_fd = open_listener(ai);
        w->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
        if (w->listen_fd < 0 || w->epoll_fd < 0 ||
            epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, w->listen_fd, &ev) < 0) {
            fprintf(stderr, "floor: listen on %s port %s: %s\n", addr, port, strerror(errno));
            return 1;
        }
    }
    freeaddrinfo(ai);
    fprintf(stderr, "floor: listening on %s port %s with %d threads\n", addr, port, threads);
    pthread_t tid;
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&tid, NULL, serve, workers[i])) {
            fprintf(stderr, "floor: cannot start thread %d\n", i);
            return 1;
        }
    }
    serve(workers[0]);
    return 0;
}
