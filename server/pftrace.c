/* The Perfetto trace writer (pftrace.h): protobuf wire format by hand. Every message is written
 * into a scratch buffer first and appended to its parent as a length-delimited field, innermost
 * first, so no length is ever guessed. */
#include "pftrace.h"

#include <string.h>

#include "twinkle/hal.h"

/* Field numbers (Perfetto's protos). */
enum {
    TRACE_PACKET = 1,                  /* Trace.packet */
    PKT_CLOCK_SNAPSHOT = 6,            /* TracePacket.clock_snapshot */
    PKT_TIMESTAMP = 8,                 /* TracePacket.timestamp (ns, the trace clock) */
    PKT_SEQ_ID = 10,                   /* TracePacket.trusted_packet_sequence_id */
    PKT_TRACK_EVENT = 11,              /* TracePacket.track_event */
    PKT_SEQ_FLAGS = 13,                /* TracePacket.sequence_flags */
    PKT_TRACK_DESCRIPTOR = 60,         /* TracePacket.track_descriptor */
    SEQ_INCREMENTAL_STATE_CLEARED = 1, /* TracePacket.SequenceFlags */
    CLK_CLOCKS = 1,                    /* ClockSnapshot.clocks */
    CLK_PRIMARY = 2,                   /* ClockSnapshot.primary_trace_clock */
    CLOCK_ID = 1,                      /* ClockSnapshot.Clock.clock_id */
    CLOCK_TS = 2,                      /* ClockSnapshot.Clock.timestamp */
    BUILTIN_CLOCK_REALTIME = 1,
    BUILTIN_CLOCK_BOOTTIME = 6,
    TD_UUID = 1,                       /* TrackDescriptor.uuid */
    TD_NAME = 2,                       /* TrackDescriptor.name */
    TD_PARENT = 5,                     /* TrackDescriptor.parent_uuid */
    TD_CHILD_ORDERING = 11,            /* TrackDescriptor.child_ordering */
    TD_DESCRIPTION = 14,               /* TrackDescriptor.description */
    ORDER_LEXICOGRAPHIC = 1,           /* TrackDescriptor.ChildTracksOrdering */
    TE_DEBUG_ANNOTATIONS = 4,          /* TrackEvent.debug_annotations */
    TE_TYPE = 9,                       /* TrackEvent.type */
    TE_TRACK_UUID = 11,                /* TrackEvent.track_uuid */
    TE_CATEGORIES = 22,                /* TrackEvent.categories */
    TE_NAME = 23,                      /* TrackEvent.name */
    TYPE_SLICE_BEGIN = 1,              /* TrackEvent.Type */
    TYPE_SLICE_END = 2,
    DA_INT = 4,                        /* DebugAnnotation.int_value */
    DA_STRING = 6,                     /* DebugAnnotation.string_value */
    DA_NAME = 10,                      /* DebugAnnotation.name */
};

enum { WIRE_VARINT = 0, WIRE_LEN = 2 };

static int reserve(twk_pf_buf *b, size_t more) {
    if (b->oom) return 0;
    if (b->n + more <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more) cap *= 2;
    unsigned char *p = twk_host_realloc(b->p, b->cap, cap, "perfetto trace");
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

static void put_varint(twk_pf_buf *b, uint64_t v) {
    if (!reserve(b, 10)) return;
    do {
        unsigned char byte = v & 0x7f;
        v >>= 7;
        b->p[b->n++] = byte | (v ? 0x80 : 0);
    } while (v);
}

static void put_tag(twk_pf_buf *b, int field, int wire) { put_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void put_uint(twk_pf_buf *b, int field, uint64_t v) {
    put_tag(b, field, WIRE_VARINT);
    put_varint(b, v);
}

static void put_bytes(twk_pf_buf *b, int field, const void *data, size_t n) {
    put_tag(b, field, WIRE_LEN);
    put_varint(b, n);
    if (!reserve(b, n)) return;
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_str(twk_pf_buf *b, int field, const char *s) { put_bytes(b, field, s, strlen(s)); }

/* Appends the scratch message m to b as field `field` and empties m (its oom carried over). */
static void put_msg(twk_pf_buf *b, int field, twk_pf_buf *m) {
    if (m->oom) b->oom = 1;
    put_bytes(b, field, m->p, m->n);
    m->n = 0;
}

static void buf_free(twk_pf_buf *b) {
    twk_host_free(b->p);
    memset(b, 0, sizeof *b);
}

void twk_pf_init(twk_pf_trace *t, uint32_t seq_id) {
    memset(t, 0, sizeof *t);
    t->seq_id = seq_id;
}

void twk_pf_free(twk_pf_trace *t) {
    buf_free(&t->out);
    buf_free(&t->packet);
    buf_free(&t->msg);
    buf_free(&t->sub);
}

int twk_pf_ok(const twk_pf_trace *t) { return !t->out.oom && !t->packet.oom && !t->msg.oom && !t->sub.oom; }

/* Starts a packet in t->packet: its sequence id (and, on the first, the sequence flags). */
static void packet_begin(twk_pf_trace *t) {
    t->packet.n = 0;
    put_uint(&t->packet, PKT_SEQ_ID, t->seq_id);
    if (!t->started) put_uint(&t->packet, PKT_SEQ_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED);
    t->started = 1;
}

static void packet_end(twk_pf_trace *t) { put_msg(&t->out, TRACE_PACKET, &t->packet); }

void twk_pf_clock_identity(twk_pf_trace *t, uint64_t ts_ns) {
    packet_begin(t);
    put_uint(&t->packet, PKT_TIMESTAMP, ts_ns);
    static const int clocks[] = {BUILTIN_CLOCK_BOOTTIME, BUILTIN_CLOCK_REALTIME};
    for (int i = 0; i < 2; i++) {
        put_uint(&t->sub, CLOCK_ID, (uint64_t)clocks[i]);
        put_uint(&t->sub, CLOCK_TS, ts_ns);
        put_msg(&t->msg, CLK_CLOCKS, &t->sub);
    }
    put_uint(&t->msg, CLK_PRIMARY, BUILTIN_CLOCK_BOOTTIME);
    put_msg(&t->packet, PKT_CLOCK_SNAPSHOT, &t->msg);
    packet_end(t);
}

void twk_pf_track(twk_pf_trace *t, uint64_t uuid, uint64_t parent_uuid, const char *name, const char *description) {
    packet_begin(t);
    put_uint(&t->msg, TD_UUID, uuid);
    put_str(&t->msg, TD_NAME, name);
    if (parent_uuid) put_uint(&t->msg, TD_PARENT, parent_uuid);
    else put_uint(&t->msg, TD_CHILD_ORDERING, ORDER_LEXICOGRAPHIC);
    if (description) put_str(&t->msg, TD_DESCRIPTION, description);
    put_msg(&t->packet, PKT_TRACK_DESCRIPTOR, &t->msg);
    packet_end(t);
}

void twk_pf_slice_begin(twk_pf_trace *t, uint64_t ts_ns, uint64_t track_uuid, const char *name, const char *category,
                        const twk_pf_arg *args, int n) {
    packet_begin(t);
    put_uint(&t->packet, PKT_TIMESTAMP, ts_ns);
    put_uint(&t->msg, TE_TYPE, TYPE_SLICE_BEGIN);
    put_uint(&t->msg, TE_TRACK_UUID, track_uuid);
    put_str(&t->msg, TE_NAME, name);
    if (category) put_str(&t->msg, TE_CATEGORIES, category);
    for (int i = 0; i < n; i++) {
        put_str(&t->sub, DA_NAME, args[i].name);
        if (args[i].str) put_str(&t->sub, DA_STRING, args[i].str);
        else put_uint(&t->sub, DA_INT, (uint64_t)args[i].num); /* int64: two's complement as a varint */
        put_msg(&t->msg, TE_DEBUG_ANNOTATIONS, &t->sub);
    }
    put_msg(&t->packet, PKT_TRACK_EVENT, &t->msg);
    packet_end(t);
}

void twk_pf_slice_end(twk_pf_trace *t, uint64_t ts_ns, uint64_t track_uuid) {
    packet_begin(t);
    put_uint(&t->packet, PKT_TIMESTAMP, ts_ns);
    put_uint(&t->msg, TE_TYPE, TYPE_SLICE_END);
    put_uint(&t->msg, TE_TRACK_UUID, track_uuid);
    put_msg(&t->packet, PKT_TRACK_EVENT, &t->msg);
    packet_end(t);
}
