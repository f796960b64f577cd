// SPDX-License-Identifier: MIT OR GPL-2.0
// crossbar's kernel relay (src/relay/kernel.rs): a stream verdict program that
// sends each relayed socket's incoming bytes straight to its peer socket.
//
// `peers` holds each relayed socket under its peer's 4-tuple (as this program
// sees it): peers[client socket's tuple] = backend socket and vice versa, so a
// socket's data goes to peers[own tuple]. A direction is redirected in the kernel only while
//  - user space holds none of its bytes (passed == consumed): bytes passed up
//    earlier must reach the peer first, or the stream would be reordered; and
//  - the bytes redirected but not yet in the peer socket (queued in its psock,
//    which the kernel does not bound for a slow reader) stay under ctl.limit;
//    past it bytes are passed up instead, where they wait in the source
//    socket's receive buffer (TCP flow control applies).
// Everything else is SK_PASS: user space reads it, as while the handshake is
// still being watched (ctl.limit == 0).
//
// Rebuild: bpf/build.sh (clang -O2 -g -target bpf; the object is committed)
// (tests/kernel_relay.rs rebuilds it and compares the program's instructions).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define AF_INET 2
#define AF_INET6 10
/* Two entries per relayed connection. */
#define MAX_SOCKETS 65536

struct tuple {
	__u32 family;
	__u32 local_ip[4];
	__u32 remote_ip[4];
	__u32 local_port;  /* host byte order */
	__u32 remote_port; /* host byte order */
};

/* Written by this program only. */
struct flow {
	__u64 redirected; /* bytes sent to the peer in the kernel */
	__u64 passed;     /* bytes passed up to user space */
	__s64 queued;     /* the peer's queue at the last check (diagnostics) */
};

/* Written by user space only. */
struct ctl {
	__u64 base;     /* bytes written to the peer socket before the relay */
	__u64 consumed; /* passed bytes user space has written to the peer */
	__u64 limit;    /* max bytes queued for the peer; 0 = pass all */
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, MAX_SOCKETS);
	__type(key, struct tuple);
	__type(value, __u32);
} peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SOCKETS);
	__type(key, struct tuple);
	__type(value, struct flow);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SOCKETS);
	__type(key, struct tuple);
	__type(value, struct ctl);
} ctls SEC(".maps");

/* The kernel's tcp_sock, only the fields read (relocated by BTF at load). */
struct tcp_sock {
	__u64 bytes_acked;
	__u32 snd_una;
	__u32 write_seq;
} __attribute__((preserve_access_index));

static struct tcp_sock *(*skc_to_tcp_sock)(void *sk) = (void *)BPF_FUNC_skc_to_tcp_sock;

static __always_inline void own_tuple(struct __sk_buff *skb, struct tuple *t)
{
	t->family = skb->family;
	if (skb->family == AF_INET6) {
		t->local_ip[0] = skb->local_ip6[0];
		t->local_ip[1] = skb->local_ip6[1];
		t->local_ip[2] = skb->local_ip6[2];
		t->local_ip[3] = skb->local_ip6[3];
		t->remote_ip[0] = skb->remote_ip6[0];
		t->remote_ip[1] = skb->remote_ip6[1];
		t->remote_ip[2] = skb->remote_ip6[2];
		t->remote_ip[3] = skb->remote_ip6[3];
	} else {
		t->local_ip[0] = skb->local_ip4;
		t->remote_ip[0] = skb->remote_ip4;
	}
	t->local_port = skb->local_port;
	/* remote_port holds the network-order port in its high half on little-endian. */
	t->remote_port = bpf_ntohl(skb->remote_port) & 0xffff;
}

/* Bytes given to the peer that are not yet in its socket (they wait in the psock's
 * queue, which the kernel does not bound), or -1 if it can't be read. */
static __always_inline __s64 queued(struct tuple *t, struct ctl *c, struct flow *f)
{
	struct bpf_sock *peer = bpf_map_lookup_elem(&peers, t);
	if (!peer)
		return -1;
	struct tcp_sock *tp = skc_to_tcp_sock(peer);
	__s64 written = -1;
	if (tp)
		written = tp->bytes_acked + (__u32)(tp->write_seq - tp->snd_una);
	bpf_sk_release(peer);
	if (written < 0)
		return -1;
	return (__s64)(c->base + c->consumed + f->redirected) - written;
}

SEC("sk_skb/stream_verdict")
int relay_verdict(struct __sk_buff *skb)
{
	struct tuple t = {};
	own_tuple(skb, &t);
	struct flow *f = bpf_map_lookup_elem(&flows, &t);
	if (!f)
		return SK_PASS;
	struct ctl *c = bpf_map_lookup_elem(&ctls, &t);
	__u64 len = skb->len;
	/* A bare FIN: TCP has already noted it (read() returns 0 once the passed bytes
	 * are read). Passed or redirected behind queued bytes, the psock's backlog
	 * treats its zero length as a broken pipe and stops the socket for good. */
	if (len == 0)
		return SK_DROP;
	if (c && c->limit && f->passed == c->consumed) {
		__s64 q = queued(&t, c, f);
		f->queued = q;
		if (q >= 0 && (__u64)q + len <= c->limit) {
			if (bpf_sk_redirect_hash(skb, &peers, &t, 0) == SK_PASS) {
				__sync_fetch_and_add(&f->redirected, len);
				return SK_PASS;
			}
		}
	}
	__sync_fetch_and_add(&f->passed, len);
	return SK_PASS;
}

char _license[] SEC("license") = "Dual MIT/GPL";
