// copy-distance: what the kernel's copy of a large reply into a TCP socket costs, by where the
// value sits in its page relative to the header sent before it (docs/benchmarks.md, "A copy
// that runs 28 bytes ahead").
//
//   cc -O2 -o copy-distance copy-distance.c -lpthread
//   copy-distance HEADER_BYTES SOURCE_PAGE_OFFSET [PAIRS] [REPLIES] [HUGE]
//
// Each pair is a sender and a receiver over loopback TCP, on two different CPUs (0 and 1; a
// second pair swaps them). The receiver asks with one byte and reads the whole reply; the
// sender answers with one sendmsg of HEADER_BYTES then a 256 KiB value, chosen at random from
// 200 values 256 KiB apart (page-aligned, like Headroom's fixed heads), starting
// SOURCE_PAGE_OFFSET bytes into its page. A reply starts the socket's page fragment at offset 0,
// so each value byte lands (HEADER_BYTES - SOURCE_PAGE_OFFSET) mod 4096 bytes further into its
// page than it was read from. HUGE=1 maps the values on 2 MiB hugetlb pages (reserve them
// first). Prints each sender's CPU time (user + system, getrusage) per reply.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define VALUE_BYTES (256 * 1024)
#define VALUES 200

static int header_bytes, source_offset, replies = 4000, huge;

struct pair {
    int sender_cpu, receiver_cpu, port;
    double sender_us_per_reply;
};

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) perror("sched_setaffinity");
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void *receiver(void *arg) {
    struct pair *p = arg;
    pin(p->receiver_cpu);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons(p->port)};
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (void *)&at, sizeof at) != 0) die("connect");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    size_t reply = (size_t)header_bytes + VALUE_BYTES;
    char *buf = malloc(reply);
    for (int i = 0; i < replies; i++) {
        char ask = 'g';
        if (write(fd, &ask, 1) != 1) die("ask");
        for (size_t got = 0; got < reply;) {
            ssize_t n = read(fd, buf + got, reply - got);
            if (n <= 0) die("read");
            got += n;
        }
    }
    close(fd);
    free(buf);
    return NULL;
}

static void *sender(void *arg) {
    struct pair *p = arg;
    pin(p->sender_cpu);
    size_t len = (size_t)VALUE_BYTES * VALUES + (4 << 20);
    char *values = mmap(NULL, len, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE | (huge ? MAP_HUGETLB : 0), -1, 0);
    if (values == MAP_FAILED) die("mmap (reserve huge pages for HUGE=1)");
    for (size_t i = 0; i < len; i++) values[i] = (char)(i * 7);
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in at = {.sin_family = AF_INET};
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t at_len = sizeof at;
    if (bind(listener, (void *)&at, sizeof at) != 0) die("bind");
    getsockname(listener, (void *)&at, &at_len);
    listen(listener, 1);
    p->port = ntohs(at.sin_port);
    pthread_t peer;
    pthread_create(&peer, NULL, receiver, p);
    int fd = accept(listener, NULL, NULL);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char *header = calloc(1, header_bytes + 1);
    unsigned x = 12345;
    struct rusage before, after;
    getrusage(RUSAGE_THREAD, &before);
    for (int i = 0; i < replies; i++) {
        char ask;
        if (read(fd, &ask, 1) != 1) die("request");
        x = x * 1103515245 + 12345;
        char *value = values + (size_t)((x >> 8) % VALUES) * VALUE_BYTES + source_offset;
        struct iovec iov[2] = {{header, header_bytes}, {value, VALUE_BYTES}};
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
        for (size_t left = (size_t)header_bytes + VALUE_BYTES; left > 0;) {
            ssize_t n = sendmsg(fd, &msg, 0);
            if (n < 0) die("sendmsg");
            left -= n;
            while (n > 0) {  // step the iovecs past what went out
                size_t take = (size_t)n < msg.msg_iov->iov_len ? (size_t)n : msg.msg_iov->iov_len;
                msg.msg_iov->iov_base = (char *)msg.msg_iov->iov_base + take;
                msg.msg_iov->iov_len -= take;
                n -= take;
                if (msg.msg_iov->iov_len == 0 && msg.msg_iovlen > 1) {
                    msg.msg_iov++;
                    msg.msg_iovlen--;
                }
            }
        }
    }
    getrusage(RUSAGE_THREAD, &after);
    pthread_join(peer, NULL);
    double us = (after.ru_utime.tv_sec - before.ru_utime.tv_sec) * 1e6 +
                (after.ru_utime.tv_usec - before.ru_utime.tv_usec) +
                (after.ru_stime.tv_sec - before.ru_stime.tv_sec) * 1e6 +
                (after.ru_stime.tv_usec - before.ru_stime.tv_usec);
    p->sender_us_per_reply = us / replies;
    close(fd);
    close(listener);
    munmap(values, len);
    free(header);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s HEADER_BYTES SOURCE_PAGE_OFFSET [PAIRS] [REPLIES] [HUGE]\n", argv[0]);
        return 2;
    }
    header_bytes = atoi(argv[1]);
    source_offset = atoi(argv[2]);
    int pairs = argc > 3 ? atoi(argv[3]) : 1;
    if (argc > 4) replies = atoi(argv[4]);
    if (argc > 5) huge = atoi(argv[5]);
    if (header_bytes < 0 || header_bytes > 4096 || source_offset < 0 || source_offset > 4095 ||
        pairs < 1 || pairs > 2 || replies < 1) {
        fprintf(stderr, "header 0..4096 bytes, source offset 0..4095, 1 or 2 pairs\n");
        return 2;
    }
    struct pair p[2] = {{.sender_cpu = 0, .receiver_cpu = 1}, {.sender_cpu = 1, .receiver_cpu = 0}};
    pthread_t t[2];
    for (int i = 0; i < pairs; i++) pthread_create(&t[i], NULL, sender, &p[i]);
    for (int i = 0; i < pairs; i++) pthread_join(t[i], NULL);
    int distance = ((header_bytes - source_offset) % 4096 + 4096) % 4096;
    for (int i = 0; i < pairs; i++)
        printf("header %d B, source page offset %d (copy runs %d B ahead mod 4 KiB), %d pair(s): sender %d: %.1f us CPU per 256 KiB reply\n",
               header_bytes, source_offset, distance, pairs, i, p[i].sender_us_per_reply);
    return 0;
}
