/* server/ — a small writer of Perfetto traces (the protobuf `Trace` that ui.perfetto.dev and
 * trace_processor read): track descriptors and track-event slices on one packet sequence, encoded
 * by hand (varints and length-delimited fields; field numbers from Perfetto's
 * protos/perfetto/trace/trace_packet.proto, track_event/track_event.proto,
 * track_event/track_descriptor.proto, track_event/debug_annotation.proto, clock_snapshot.proto).
 * Pure: no I/O, memory from the host allocator. */
#ifndef TWK_SERVER_PFTRACE_H
#define TWK_SERVER_PFTRACE_H

#include <stddef.h>
#include <stdint.h>

/* A growing byte buffer; oom is set (and stays set) when an append could not get memory. */
typedef struct twk_pf_buf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} twk_pf_buf;

/* A debug annotation of a slice: a string (str non-NULL) or an integer. */
typedef struct twk_pf_arg {
    const char *name;
    const char *str;
    int64_t num;
} twk_pf_arg;

/* The trace being written: out holds the encoded `Trace` so far. */
typedef struct twk_pf_trace {
    twk_pf_buf out;
    twk_pf_buf packet, msg, sub; /* scratch: a packet, its message, a nested message */
    uint32_t seq_id;             /* trusted_packet_sequence_id of every packet */
    int started;                 /* the first packet (sequence flags) was written */
} twk_pf_trace;

/* An empty trace on packet sequence seq_id (> 0). */
void twk_pf_init(twk_pf_trace *t, uint32_t seq_id);
/* Frees the buffers (out too). */
void twk_pf_free(twk_pf_trace *t);
/* A clock snapshot saying the trace's timestamps (BOOTTIME, the default trace clock) equal REALTIME
 * at ts_ns, so the UI can show wall-clock times; written first. */
void twk_pf_clock_identity(twk_pf_trace *t, uint64_t ts_ns);
/* A track: uuid (> 0), its parent's uuid (0: a top-level track), its name, an optional description
 * (NULL: none). Tracks that share a name and a parent are shown merged as one. */
void twk_pf_track(twk_pf_trace *t, uint64_t uuid, uint64_t parent_uuid, const char *name, const char *description);
/* A slice begins on a track at ts_ns: its name, category (NULL: none) and n debug annotations. */
void twk_pf_slice_begin(twk_pf_trace *t, uint64_t ts_ns, uint64_t track_uuid, const char *name, const char *category,
                        const twk_pf_arg *args, int n);
/* The innermost open slice of the track ends at ts_ns. */
void twk_pf_slice_end(twk_pf_trace *t, uint64_t ts_ns, uint64_t track_uuid);
/* 1 when every append so far got its memory (t->out is then the whole trace), 0 otherwise. */
int twk_pf_ok(const twk_pf_trace *t);

#endif
