/* train/chat_template.c + jinja_*.c: every fixture template (tests/chat/templates) on every
 * conversation (tests/chat/conversations.json) byte-identical to transformers' apply_chat_template
 * (tests/chat/expected.json, made by tests/chat/make_fixtures.py), the same errors where the
 * template raises, loss masks equal to transformers' {% generation %} spans, and unsupported
 * constructs refused naming the line. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>

#include "twinkle/chat.h"
#include "twinkle/status.h"
#include "twinkle/hal.h"

static int failures;
#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            failures++;                                                                                                \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
        }                                                                                                              \
    } while (0)

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *d = malloc((size_t)n + 1);
    if (d && fread(d, 1, (size_t)n, f) != (size_t)n) {
        free(d);
        d = NULL;
    }
    if (d) d[n] = 0;
    fclose(f);
    return d;
}

static const char *str_or_null(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The conversation object as a request: every field but "name". */
static char *request_of(const cJSON *conv) {
    cJSON *c = cJSON_Duplicate(conv, 1);
    cJSON_DeleteItemFromObjectCaseSensitive(c, "name");
    char *s = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    return s;
}

static twk_chat_template *load(const char *name, const char *bos, const char *eos) {
    char path[1024];
    snprintf(path, sizeof path, "%s/templates/%s", TWK_CHAT_DIR, name);
    char *src = slurp(path);
    if (!src) return NULL;
    twk_chat_template *t = NULL;
    twk_status st = twk_chat_template_new(src, bos, eos, &t);
    CHECK(st == TWK_OK, "%s: parse: %s", name, twk_last_error());
    free(src);
    return t;
}

static void fixtures(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/conversations.json", TWK_CHAT_DIR);
    char *ct = slurp(path);
    snprintf(path, sizeof path, "%s/expected.json", TWK_CHAT_DIR);
    char *et = slurp(path);
    cJSON *convs = cJSON_Parse(ct), *exp = cJSON_Parse(et);
    CHECK(convs && exp, "fixtures missing or not JSON");
    if (!convs || !exp) return;
    int total = 0, identical = 0, errors_ok = 0, span_sets = 0, span_ok = 0, heur = 0, heur_ok = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, exp) {
        const char *tn = str_or_null(r, "template"), *cn = str_or_null(r, "conversation");
        const cJSON *conv = NULL, *c;
        cJSON_ArrayForEach(c, convs) if (strcmp(str_or_null(c, "name"), cn) == 0) conv = c;
        CHECK(conv, "no conversation %s", cn);
        if (!conv) continue;
        twk_chat_template *t = load(tn, str_or_null(r, "bos_token"), str_or_null(r, "eos_token"));
        if (!t) {
            CHECK(0, "%s: cannot load", tn);
            continue;
        }
        char *req = request_of(conv), *out = NULL;
        size_t len = 0;
        total++;
        twk_status st = twk_chat_render(t, req, &out, &len);
        const char *want = str_or_null(r, "rendered"), *err = str_or_null(r, "error");
        if (want) {
            bool same = st == TWK_OK && len == strlen(want) && memcmp(out, want, len) == 0;
            identical += same;
            CHECK(same, "%s × %s: not byte-identical (%s)\n--- want\n%s\n--- got\n%s", tn, cn,
                  st ? twk_last_error() : "rendered", want, out ? out : "");
        } else {
            bool ok = st != TWK_OK && err && strstr(twk_last_error(), err) != NULL;
            errors_ok += ok;
            CHECK(ok, "%s × %s: expected the error '%s', got status %d '%s'", tn, cn, err ? err : "?", (int)st,
                  twk_last_error());
        }
        const cJSON *spans = cJSON_GetObjectItemCaseSensitive(r, "spans");
        if (want && spans) {
            /* the tagged template's mask equals transformers' generation spans */
            uint8_t *mask = NULL;
            char *o2 = NULL;
            size_t n2 = 0;
            st = twk_chat_render_mask(t, req, TWK_TRAIN_ON_ASSISTANT, &o2, &n2, &mask);
            CHECK(st == TWK_OK, "%s × %s: mask: %s", tn, cn, twk_last_error());
            uint8_t *ref = calloc(n2 + 1, 1);
            const cJSON *s;
            cJSON_ArrayForEach(s, spans) for (int i = cJSON_GetArrayItem(s, 0)->valueint;
                                              i < cJSON_GetArrayItem(s, 1)->valueint; i++) ref[i] = 1;
            span_sets++;
            bool same = st == TWK_OK && memcmp(mask, ref, n2) == 0;
            /* last: the last maximal run of the reference (assistant messages are separated by others) */
            uint8_t *ml = NULL;
            char *ol = NULL;
            if (twk_chat_render_mask(t, req, TWK_TRAIN_ON_LAST, &ol, &n2, &ml) == TWK_OK) {
                size_t i = n2;
                while (i > 0 && !ref[i - 1]) i--;
                while (i > 0 && ref[i - 1]) i--;
                for (size_t k = 0; k < n2; k++) same = same && ml[k] == (k >= i && ref[k]);
            } else same = false;
            twk_host_free(ml);
            twk_host_free(ol);
            span_ok += same;
            CHECK(same, "%s × %s: generation mask (assistant or last) differs from transformers' spans", tn, cn);
            /* the untagged template's assistant mask (no generation tags: the rule of chat.h) gives the
             * same bytes wherever the tagged and untagged templates render the same text */
            char untagged[256];
            snprintf(untagged, sizeof untagged, "%.*s.jinja", (int)(strstr(tn, ".gen.") - tn), tn);
            twk_chat_template *u = load(untagged, str_or_null(r, "bos_token"), str_or_null(r, "eos_token"));
            char *o3 = NULL;
            uint8_t *m3 = NULL;
            size_t n3 = 0;
            if (u && twk_chat_render_mask(u, req, TWK_TRAIN_ON_ASSISTANT, &o3, &n3, &m3) == TWK_OK && n3 == n2 &&
                memcmp(o3, o2, n2) == 0) {
                heur++;
                bool eq = memcmp(m3, ref, n2) == 0;
                heur_ok += eq;
                CHECK(eq, "%s × %s: untagged assistant mask differs from the generation spans", untagged, cn);
            }
            twk_host_free(o3);
            twk_host_free(m3);
            twk_chat_template_free(u);
            free(ref);
            twk_host_free(mask);
            twk_host_free(o2);
        }
        twk_host_free(out);
        cJSON_free(req);
        twk_chat_template_free(t);
    }
    printf("chat templates: %d renderings: %d byte-identical, %d expected errors reproduced; generation masks %d/%d; "
           "untagged assistant masks equal to the tagged spans %d/%d\n",
           total, identical, errors_ok, span_ok, span_sets, heur_ok, heur);
    CHECK(total >= 120 && identical + errors_ok == total, "not every rendering matched");
    CHECK(heur >= 20, "too few mask comparisons (%d)", heur);
    cJSON_Delete(convs);
    cJSON_Delete(exp);
    free(ct);
    free(et);
}

/* Masks under the three modes on a Qwen2.5 conversation, checked against the spans computed here
 * from the rendered text: assistant content + "<|im_end|>". */
static void modes(void) {
    twk_chat_template *t = load("qwen2.5.jinja", NULL, "<|im_end|>");
    if (!t) return;
    const char *req =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"B1\"},"
        "{\"role\":\"user\",\"content\":\"c\"},{\"role\":\"assistant\",\"content\":\"D22\"}]}";
    int want_counts[3] = {-1, 2 + 10 + 3 + 10, 3 + 10};
    for (int m = 0; m < 3; m++) {
        char *out = NULL;
        uint8_t *mask = NULL;
        size_t n = 0;
        twk_status st = twk_chat_render_mask(t, req, (twk_train_on)m, &out, &n, &mask);
        CHECK(st == TWK_OK, "mode %d: %s", m, twk_last_error());
        if (st) continue;
        int cnt = 0;
        for (size_t i = 0; i < n; i++) cnt += mask[i];
        int want = m == 0 ? (int)n : want_counts[m];
        CHECK(cnt == want, "mode %d: %d weighted bytes, want %d", m, cnt, want);
        if (m == 2) {
            const char *d = strstr(out, "D22<|im_end|>");
            CHECK(d && mask[d - out] && mask[d - out + 12] && !mask[d - out - 1] && !mask[d - out + 13],
                  "last: wrong span");
        }
        twk_host_free(out);
        twk_host_free(mask);
    }
    twk_chat_template_free(t);
    /* Qwen3 without thinking: the generation prompt ends in an empty think block that earlier turns
     * lack; content beginning with '<' still starts the span */
    t = load("qwen3.jinja", NULL, "<|im_end|>");
    if (!t) return;
    const char *req3 =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":"
        "\"<b>x</b>\"},{\"role\":\"user\",\"content\":\"c\"},{\"role\":\"assistant\",\"content\":\"y\"}],"
        "\"enable_thinking\":false}";
    char *out = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    CHECK(twk_chat_render_mask(t, req3, TWK_TRAIN_ON_ASSISTANT, &out, &n, &mask) == TWK_OK, "qwen3: %s",
          twk_last_error());
    const char *b = out ? strstr(out, "<b>x</b><|im_end|>") : NULL;
    const char *y = out ? strstr(out, "<think>\n\n</think>\n\ny<|im_end|>") : NULL;
    CHECK(b && y && mask[b - out] && !mask[b - out - 1] && mask[b - out + 17] && !mask[b - out + 18],
          "qwen3: first span");
    CHECK(y && !mask[y - out] && mask[y - out + 19] && mask[y - out + 29] && !mask[y - out + 30], "qwen3: last span");
    twk_host_free(out);
    twk_host_free(mask);
    twk_train_on mo;
    CHECK(twk_train_on_parse("last", &mo) == TWK_OK && mo == TWK_TRAIN_ON_LAST, "parse last");
    CHECK(twk_train_on_parse("some", &mo) == TWK_ERR_INVALID_ARG && strstr(twk_last_error(), "some"), "parse bad");
    twk_chat_template_free(t);
}

static void expect_error(const char *src, const char *req, twk_status code, const char *needle1, const char *needle2) {
    twk_chat_template *t = NULL;
    twk_status st = twk_chat_template_new(src, "<s>", "</s>", &t);
    if (st == TWK_OK) {
        char *out = NULL;
        st = twk_chat_render(t, req ? req : "{\"messages\":[]}", &out, NULL);
        twk_host_free(out);
        twk_chat_template_free(t);
    }
    const char *msg = twk_last_error();
    CHECK(st == code && strstr(msg, needle1) && (!needle2 || strstr(msg, needle2)),
          "template %s: want status %d with '%s' / '%s', got %d '%s'", src, (int)code, needle1, needle2 ? needle2 : "",
          (int)st, msg);
}

static void negatives(void) {
    expect_error("hello\n{% macro m() %}x{% endmacro %}", NULL, TWK_ERR_UNSUPPORTED, "line 2", "macro");
    expect_error("a\nb\n{{ 'x' | wordwrap }}", NULL, TWK_ERR_UNSUPPORTED, "line 3", "wordwrap");
    expect_error("{% if x is odd_thing %}{% endif %}", NULL, TWK_ERR_UNSUPPORTED, "line 1", "odd_thing");
    expect_error("\n\n\n{{ 'abc'.zfill(5) }}", NULL, TWK_ERR_UNSUPPORTED, "line 4", "zfill");
    expect_error("{% include 'other.jinja' %}", NULL, TWK_ERR_UNSUPPORTED, "line 1", "include");
    expect_error("{% set x %}block{% endset %}", NULL, TWK_ERR_UNSUPPORTED, "line 1", "block set");
    expect_error("{% for x in y recursive %}{% endfor %}", NULL, TWK_ERR_UNSUPPORTED, "line 1", "recursive");
    expect_error("{{ '%s' % 1.5 }}", NULL, TWK_ERR_UNSUPPORTED, "line 1", "'%'");
    expect_error("{{ 'a b c'.split(' ', 1) }}", NULL, TWK_ERR_UNSUPPORTED, "line 1", "maxsplit");
    expect_error("{{ [3, 1] | sort }}", NULL, TWK_ERR_UNSUPPORTED, "line 1", "sort");
    expect_error("{{ messages[0].content.upper() }}", "{\"messages\":[{\"content\":\"\u00e9t\u00e9\"}]}",
                 TWK_ERR_UNSUPPORTED, "line 1", "non-ASCII");
    expect_error("x\n{% if true %}\nno end", NULL, TWK_ERR_INVALID_ARG, "line 2", "never closed");
    expect_error("{{ raise_exception('custom failure') }}", NULL, TWK_ERR_INVALID_ARG, "custom failure", NULL);
    expect_error("{{ messages[0].content.x.y }}", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                 TWK_ERR_INVALID_ARG, "line 1", "'str object' has no attribute 'x'");
    expect_error("{{ x }}", "{\"messages\":[{\"role\":\"user\"", TWK_ERR_INVALID_ARG, "request", "offset");
    expect_error("{{ x }}", "{\"message\":[]}", TWK_ERR_INVALID_ARG, "messages", NULL);
    char deep[512] = "{{ ";
    for (int i = 0; i < 150; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 150; i++) strcat(deep, ")");
    strcat(deep, " }}");
    expect_error(deep, NULL, TWK_ERR_UNSUPPORTED, "line 1", "nested");
    expect_error("{{ x }}", "{\"messages\":[],\"x\":99999999999999999999}", TWK_ERR_INVALID_ARG, "64-bit", NULL);
    /* things the subset does: checked against the output of jinja2 in transformers' environment */
    struct {
        const char *src, *req, *want;
    } ok[] = {
        {"{{ [1, 2.5, 'a', none, true] }}|{{ {'k': 1.0} }}|{{ 1e20 * 1.0 }}|{{ 0.0001 }}|{{ 1/3 }}", NULL,
         "[1, 2.5, 'a', None, True]|{'k': 1.0}|1e+20|0.0001|0.3333333333333333"},
        {"{{ {'a': [1, {'b': none}], 'c': 'é\"\\n'} | tojson }}|{{ [] | tojson(indent=2) }}|{{ {'a': [1]} | "
         "tojson(indent=2) }}",
         NULL, "{\"a\": [1, {\"b\": null}], \"c\": \"é\\\"\\n\"}|[]|{\n  \"a\": [\n    1\n  ]\n}"},
        {"{{ '  a b  '.split() }}{{ 'a,,b'.split(',') }}{{ 'xxhixx'.strip('x') }}{{ 'héllo'[1:3] }}{{ 'abc'[::-1] }}",
         NULL, "['a', 'b']['a', '', 'b']hiélcba"},
        {"{% for k, v in {'a': 1, 'b': 2}.items() if v > 1 %}{{ k }}{{ loop.index }}{{ loop.last }}{% endfor %}", NULL,
         "b1True"},
        {"{% set ns = namespace(n=0) %}{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{% set ns.n = ns.n "
         "+ i %}{% endfor %}{{ ns.n }}",
         NULL, "3"},
        {"  {% if true %}\n  x\n  {%- endif %}\n{# c #}\ny {{- ' z' }} ", NULL, "  xy z "},
        {"{% if true %}\r\nx\r\n{% endif %}\r\ny {{ 'a\r\nb' }}\r\n", NULL, "x\ny a\nb"},
        {"{{ v }}", "{\"messages\":[],\"v\":[\"a\\u00a0b\",\"\u00e9\",\"x\\u2028\",\"\\u0085\",\"\\ue000\",\"it's\"]}",
         "['a\\xa0b', '\u00e9', 'x\\u2028', '\\x85', '\\ue000', \"it's\"]"},
        {"{{ 'a' ~ 1 ~ none }}{{ 7 // 2 }}{{ -7 // 2 }}{{ -7 % 3 }}{{ 'b' if false }}{{ 'c' if 0 else 'd' }}", NULL,
         "a1None3-42d"},
        {"{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('+') }}",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"u1\"},{\"role\":\"assistant\",\"content\":\"a\",\"x\":null},"
         "{\"role\":\"user\",\"content\":\"u2\"}]}",
         "u1+u2"},
        {"{{ messages[1].x is defined }}{{ messages[1].thinking }}",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"u1\"},{\"role\":\"assistant\",\"content\":\"a\",\"x\":null,"
         "\"reasoning\":\"r\"}]}",
         "Falser"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        twk_chat_template *t = NULL;
        twk_status st = twk_chat_template_new(ok[i].src, NULL, NULL, &t);
        char *out = NULL;
        if (!st) st = twk_chat_render(t, ok[i].req ? ok[i].req : "{\"messages\":[]}", &out, NULL);
        const char *want = ok[i].want;
        CHECK(st == TWK_OK && strcmp(out, want) == 0, "subset case %zu: want [%s] got [%s] (%s)", i, want,
              out ? out : "", st ? twk_last_error() : "");
        twk_host_free(out);
        twk_chat_template_free(t);
    }
}

/* Every prefix of every fixture template (and of a few bytes after it cut) parses and renders or
 * fails with a message; none crashes (the sanitizer build runs this too). */
static void prefixes(void) {
    static const char *names[] = {"qwen2.5.jinja", "qwen3.jinja", "llama3.1.jinja", "llama3.2.jinja",
                                  "mistral-v3.jinja"};
    const char *req = "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"u\"},"
                      "{\"role\":\"assistant\",\"content\":\"a\"}],\"add_generation_prompt\":true}";
    int tried = 0, failed_with_message = 0;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/templates/%s", TWK_CHAT_DIR, names[k]);
        char *src = slurp(path);
        if (!src) continue;
        size_t n = strlen(src);
        for (size_t cut = 0; cut < n; cut += 5) {
            char saved = src[cut];
            src[cut] = 0;
            twk_chat_template *t = NULL;
            twk_clear_error();
            twk_status st = twk_chat_template_new(src, "<s>", "</s>", &t);
            char *out = NULL;
            if (!st) st = twk_chat_render(t, req, &out, NULL);
            tried++;
            if (st) {
                failed_with_message += twk_last_error()[0] != 0;
                CHECK(twk_last_error()[0], "%s cut at %zu: failed without a message", names[k], cut);
            }
            twk_host_free(out);
            twk_chat_template_free(t);
            src[cut] = saved;
        }
        free(src);
    }
    /* and every prefix of a request with tools, tool calls and escapes, on the Qwen3 template */
    twk_chat_template *q = load("qwen3.jinja", NULL, "<|im_end|>");
    const char *full =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\\u00e9\\n\\\"x\\\"\"},{\"role\":\"assistant\","
        "\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":[1,2.5e3,-7,"
        "true,null]}}}]},{\"role\":\"tool\",\"content\":\"r\"}],\"tools\":[{\"type\":\"function\"}],"
        "\"add_generation_prompt\":true}";
    int req_tried = 0, req_ok = 0;
    for (size_t cut = 0; q && cut <= strlen(full); cut++) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%.*s", (int)cut, full);
        char *out = NULL;
        twk_clear_error();
        twk_status st = twk_chat_render(q, buf, &out, NULL);
        req_tried++;
        req_ok += st == TWK_OK;
        CHECK(st == TWK_OK || twk_last_error()[0], "request cut at %zu: failed without a message", cut);
        twk_host_free(out);
    }
    CHECK(req_ok == 1, "only the whole request renders (%d did)", req_ok);
    twk_chat_template_free(q);
    printf("prefixes: %d cut templates, %d refused with a message, none crashed; %d cut requests, %d rendered\n", tried,
           failed_with_message, req_tried, req_ok);
}

/* tokenizer_config.json: a string template with AddedToken-object bos / eos, a list of named
 * templates (the "default" one), and a file without chat_template. */
static void load_config(void) {
    char dir[] = "/tmp/twk_chat_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    const char *cfgs[] = {
        "{\"bos_token\": {\"content\": \"<B>\", \"lstrip\": false}, \"eos_token\": \"<E>\","
        " \"chat_template\": \"{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}\"}",
        "{\"eos_token\": \"<E>\", \"pad_token\": \"<P>\", \"unk_token\": {\"content\": \"<U>\"},"
        " \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\","
        " \"template\": \"{{ bos_token is defined }}{{ messages[0].content }}{{ pad_token }}{{ unk_token }}\"}]}",
        "{\"eos_token\": \"<E>\"}"};
    const char *want[] = {"<B>hi<E>", "Falsehi<P><U>", NULL};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(path, "w");
        if (!f) {
            CHECK(0, "write %s", path);
            break;
        }
        fputs(cfgs[i], f);
        fclose(f);
        twk_chat_template *t = NULL;
        twk_status st = twk_chat_template_load(dir, &t);
        if (!want[i]) {
            CHECK(st == TWK_ERR_NOT_FOUND && strstr(twk_last_error(), "chat_template"), "config %d: %s", i,
                  twk_last_error());
            continue;
        }
        char *out = NULL;
        if (!st) st = twk_chat_render(t, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &out, NULL);
        CHECK(st == TWK_OK && strcmp(out, want[i]) == 0, "config %d: got [%s] (%s)", i, out ? out : "",
              twk_last_error());
        twk_host_free(out);
        twk_chat_template_free(t);
    }
    remove(path);
    rmdir(dir);
    twk_chat_template *t = NULL;
    CHECK(twk_chat_template_load("/nonexistent/dir", &t) == TWK_ERR_IO, "missing file: %s", twk_last_error());
}

/* Threads rendering with one template at once get the single-threaded result. */
typedef struct job {
    const twk_chat_template *t;
    const char *req, *want;
    int bad;
} job;
static void *render_many(void *arg) {
    job *j = arg;
    for (int i = 0; i < 200; i++) {
        char *out = NULL;
        if (twk_chat_render(j->t, j->req, &out, NULL) != TWK_OK || strcmp(out, j->want) != 0) j->bad++;
        twk_host_free(out);
    }
    return NULL;
}

static void threads(void) {
    twk_chat_template *t = load("qwen3.jinja", NULL, "<|im_end|>");
    if (!t) return;
    const char *req = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
                      "\"reasoning_content\":\"r\",\"content\":\"a\"}],\"add_generation_prompt\":false}";
    char *want = NULL;
    CHECK(twk_chat_render(t, req, &want, NULL) == TWK_OK, "threads: %s", twk_last_error());
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){t, req, want, 0};
        pthread_create(&th[i], NULL, render_many, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].bad == 0, "thread %d: %d renderings differ", i, jobs[i].bad);
    }
    twk_host_free(want);
    twk_chat_template_free(t);
}

int main(void) {
    threads();
    load_config();
    fixtures();
    prefixes();
    modes();
    negatives();
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
