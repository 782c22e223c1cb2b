/* The parsed form of a chat template (private to train/jinja_*.c). */
#ifndef TWK_JINJA_AST_H
#define TWK_JINJA_AST_H

#include "jinja.h"

typedef enum jj_ek {
    E_LIT,
    E_NAME,
    E_ATTR,
    E_ITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_NOT,
    E_NEG,
    E_BIN,
    E_AND,
    E_OR,
    E_COND,
    E_LIST,
    E_DICT
} jj_ek;

typedef struct jj_expr jj_expr;
struct jj_expr {
    jj_ek k;
    int line;
    const char *name; /* E_NAME, E_ATTR, E_FILTER, E_TEST, E_BIN (operator) */
    jj_val lit;
    jj_expr *a, *b, *c; /* operands; E_SLICE: a[b:c:d] */
    jj_expr *d;
    jj_expr **args;       /* call / filter / test arguments, E_LIST items, E_DICT keys and values alternating */
    const char **kwnames; /* NULL for positional */
    int nargs;
    bool negate; /* E_TEST: is not */
};

typedef enum jj_sk { S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_BREAK, S_CONTINUE, S_GEN } jj_sk;

typedef struct jj_stmt jj_stmt;
typedef struct jj_body {
    jj_stmt **s;
    int n, cap;
} jj_body;
struct jj_stmt {
    jj_sk k;
    int line;
    const char *text;
    size_t len; /* S_TEXT */
    jj_expr *e; /* S_OUT, S_SET value, S_FOR iterable */
    jj_expr **conds;
    jj_body *bodies;
    int nbranch; /* S_IF: else is a branch with cond NULL */
    const char *targets[4];
    int ntargets;         /* S_FOR names; S_SET: targets[0] (name), targets[1] (attr or NULL) */
    jj_expr *filter;      /* S_FOR ... if cond */
    jj_body body, orelse; /* S_FOR, S_GEN */
};

struct jj_template {
    jj_arena *arena;
    jj_body body;
    bool has_generation; /* a {% generation %} block anywhere */
};

#endif
