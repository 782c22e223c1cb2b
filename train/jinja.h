/* A Jinja2 subset for Hugging Face chat templates (private to train/).
 *
 * The environment is transformers' apply_chat_template one: trim_blocks, lstrip_blocks,
 * the loopcontrols extension, {% generation %}, and the globals raise_exception, namespace,
 * strftime_now and dict. Values follow Python's semantics (str of a float, repr of lists, json.dumps
 * of tojson). Anything outside the subset is an error naming the template line and the construct.
 * A parsed template is immutable; rendering uses its own memory (thread-safe). */
#ifndef TWK_JINJA_H
#define TWK_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "twinkle/status.h"

typedef struct jj_arena jj_arena;
typedef struct jj_list jj_list;
typedef struct jj_dict jj_dict;

typedef enum jj_kind {
    JJ_UNDEF,
    JJ_NONE,
    JJ_BOOL,
    JJ_INT,
    JJ_FLOAT,
    JJ_STR,
    JJ_LIST,
    JJ_DICT,
    JJ_NS,
    JJ_METHOD,
    JJ_FUNC
} jj_kind;

typedef struct jj_val {
    jj_kind kind;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *s;
            size_t n;
        } str; /* JJ_STR, JJ_FUNC (name), JJ_UNDEF (Jinja's message for it, or NULL) */
        jj_list *list;
        jj_dict *dict; /* JJ_DICT, JJ_NS */
        struct {
            struct jj_val *self;
            const char *name;
        } m;
    } u;
} jj_val;

struct jj_list {
    size_t n, cap;
    jj_val *v;
};
struct jj_dict {
    size_t n, cap;
    jj_val *k, *v;
};

/* Arena: every value of one render lives here and goes with jj_arena_free. */
jj_arena *jj_arena_new(void);
void jj_arena_free(jj_arena *a);
void *jj_alloc(jj_arena *a, size_t n); /* zeroed; NULL on OOM */

jj_val jj_str(jj_arena *a, const char *s, size_t n); /* copies; kind JJ_UNDEF-free NONE on OOM */
jj_list *jj_list_new(jj_arena *a);
jj_dict *jj_dict_new(jj_arena *a);
bool jj_list_push(jj_arena *a, jj_list *l, jj_val v);
bool jj_dict_set(jj_arena *a, jj_dict *d, jj_val k, jj_val v); /* replaces an equal key in place */
jj_val *jj_dict_get(const jj_dict *d, const char *key, size_t n);

bool jj_truthy(jj_val v);
bool jj_equal(jj_val a, jj_val b); /* Python == */

/* Dynamic byte buffer. */
typedef struct jj_buf {
    char *p;
    size_t n, cap;
    bool oom;
} jj_buf;
void jj_buf_put(jj_buf *b, const char *s, size_t n);
void jj_buf_puts(jj_buf *b, const char *s);

/* Python str(v) (mode 0), repr(v) (mode 1) appended to b; undefined is "". */
void jj_to_str(jj_buf *b, jj_val v, int mode);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: None), sort_keys=False); error naming the type. */
twk_status jj_to_json(jj_buf *b, jj_val v, int indent, int depth);
/* json.loads of s[0..n) into arena values (ints stay ints); errors name the offset. */
twk_status jj_from_json(jj_arena *a, const char *s, size_t n, jj_val *out);

/* Python's str.isspace for the UTF-8 character at s (len in *clen), 0 if not a space. */
bool jj_is_space(const char *s, size_t n, size_t *clen);
size_t jj_utf8_len(const char *s, size_t n); /* code points */
/* Byte offset of code point index `cp` (clamped to n). */
size_t jj_utf8_offset(const char *s, size_t n, int64_t cp);

typedef struct jj_template jj_template;

/* Parses template source; errors are TWK_ERR_INVALID_ARG (syntax) or TWK_ERR_UNSUPPORTED
 * (a construct outside the subset), both naming "line N". */
twk_status jj_parse(const char *src, size_t n, jj_template **out);

/* Records "chat template line L: <message>" as the last error and returns code (the parser's and
 * the evaluator's errors alike). */
twk_status jj_error(twk_status code, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void jj_template_free(jj_template *t);
/* Whether the template has a {% generation %} block (then it alone defines assistant spans). */
bool jj_template_has_generation(const jj_template *t);

/* One render's output: bytes, the generation spans (byte offsets, {% generation %} blocks) and for
 * each byte the index of the item of `tracked` (the messages list) whose for-loop iteration wrote it
 * (-1 outside such loops). */
typedef struct jj_output {
    jj_buf text;
    int32_t *owner;
    size_t owner_cap;
    int64_t (*spans)[2];
    size_t nspans, spans_cap;
} jj_output;

/* Renders with the variables of `vars` (a JJ_DICT); `tracked` may be NULL. Errors name the line. */
twk_status jj_render(const jj_template *t, jj_arena *a, jj_dict *vars, const jj_list *tracked, jj_output *out);
void jj_output_free(jj_output *o);

#endif
