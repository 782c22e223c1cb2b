/* The op test cases shared by test_ops (every op against float64 references
 * and finite differences) and backend_ops (every op on each device against
 * the CPU backend): the case table, its input generators, and the graph a
 * case builds. Test-only code (tests/). */
#ifndef TWK_OP_CASES_H
#define TWK_OP_CASES_H

#include <stdint.h>

#include "ref_ops.h"
#include "twinkle/twinkle.h"

enum gen { G_NORMAL, G_IDS, G_IDS_TOP, G_POS, G_SEG, G_SEG_LONG, G_SEG_PAT, G_POSITIVE, G_ROWS, G_HI };

typedef struct in_spec {
    int ndim;
    int64_t ne[4]; /* negative: per-token coefficient (TWK_TOK) */
    twk_dtype type;
    int diff;       /* differentiable: a trainable param */
    enum gen gen;
    int64_t limit;  /* ids in [0, limit) */
} in_spec;

typedef struct op_case op_case;
typedef twk_id (*build_fn)(twk_graph *g, const twk_id *in, const op_case *c);
typedef void (*ref_fn)(const op_case *c, rt *in, rt *out);

struct op_case {
    const char *name;
    int n_in;
    in_spec in[6];
    build_fn build;
    ref_fn ref;
    double fwd_tol, bwd_tol; /* test_ops' tolerances (max-relative error vs float64) */
    int ip[4];
    double fp[2];
    int64_t cap; /* token capacity (cases with token dims) */
};

/* The cases test_ops runs (and backend_ops too). */
extern const op_case opc_cases[];
extern const int opc_n_cases;
/* Extra cases backend_ops adds: a token-dim case for each op whose cases in
 * opc_cases have none, so every op also runs below its capacity. */
extern const op_case opc_extra_cases[];
extern const int opc_n_extra_cases;
/* The mixture-of-experts cases (op_cases_moe.c): test_ops runs them; backend_ops on the
 * devices that have every op a case uses (a skip line for the others). */
extern const op_case opc_moe_cases[];
extern const int opc_n_moe_cases;
/* The two-product unembedding's cases (op_cases_unembed.c), an op only some backends have:
 * test_ops runs them; backend_ops on the devices that have it (a skip line for the others). */
extern const op_case opc_dir_cases[];
extern const int opc_n_dir_cases;

/* Size of a spec dim at token count n (negative dims are per-token). */
int64_t opc_actual(int64_t ne, int64_t n);

/* Creates the case's leaves in g ("in0".. : differentiable f32 inputs are
 * trainable params, the rest inputs), sizes in[0..n_in) for token count n and
 * fills them from r as the specs say (normal floats, ids, positions, packed
 * segments, distinct rows, hi > lo), then builds the op. Returns the op's
 * output id, or -1 on a build error (see twk_graph_status). in[i].d are
 * calloc'ed: free them with opc_free_inputs. */
twk_id opc_build(const op_case *c, twk_graph *g, int64_t n, twk_rng *r, twk_id *ids, rt *in);
void opc_free_inputs(const op_case *c, rt *in);
/* The float64 logprobs of h w^T (in: h, w, targets), the reference of the fused unembeddings. */
void opc_ref_unembed(const op_case *c, rt *in, rt *y);

/* An f32 input named "R" with y's symbolic shape (token dims kept), the
 * weight of the scalar loss sum(y * R); -1 on error. */
twk_id opc_weight_input(twk_graph *g, twk_id y);

/* Input i's data as the engine takes it (f32, i32 or i64), malloc'ed;
 * *bytes gets its size. NULL when out of memory. */
void *opc_host_input(const op_case *c, int i, const rt *in, size_t *bytes);

#endif
