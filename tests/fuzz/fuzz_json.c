/* fuzz_json — the service's JSON request parsing: every endpoint's body (and
 * the REST paths) through svc_handle, the real handler of `twinkle serve`,
 * over a socketpair. The service runs with a keyless (open) store in a scratch
 * folder, the built-in tiny model (made once) with small limits, and one
 * session, training run and sampling session made at start; in the input,
 * "$S", "$M" and "$P" stand for their ids so the fuzzer reaches the checks
 * behind the id lookups.
 *
 * Input: byte 0 picks the endpoint; for POST endpoints the rest is the body;
 * for REST ones the first line (escaped) extends the path and the rest is
 * the body. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>

#include "fuzz_util.h"
#include "api_util.h"
#include "svc.h"

static uv_loop_t loop;
static svc *S;
static char ses_id[128], run_id[128], smp_id[192];

static const char *const post_routes[] = {
    "create_session", "session_heartbeat", "create_model", "get_info", "unload_model", "optim_step",
    "save_weights", "save_weights_for_sampler", "load_weights", "weights_info", "retrieve_future",
    "create_sampling_session", "asample", "forward_backward", "telemetry", "client/config",
    "create_training_client_from_state"};
static const char *const rest_routes[] = {
    "GET training_runs", "GET training_runs/$M", "GET training_runs/$M/checkpoints", "GET sessions",
    "GET sessions/$S", "GET checkpoints", "GET samplers/$P", "GET get_server_capabilities",
    "DELETE training_runs/$M/checkpoints/", "PUT training_runs/$M/checkpoints/", "POST training_runs/$M/checkpoints/",
    "POST sessions/$S/"};
#define N_POST (sizeof post_routes / sizeof *post_routes)
#define N_REST (sizeof rest_routes / sizeof *rest_routes)

/* Appends src[0..n) to dst (cap) with the placeholders replaced; url: escape
 * what a URL may not hold. Returns the new length. */
static size_t expand(char *dst, size_t len, size_t cap, const uint8_t *src, size_t n, int url) {
    for (size_t i = 0; i < n && len + 4 < cap; i++) {
        const char *rep = NULL;
        if (src[i] == '$' && i + 1 < n) rep = src[i + 1] == 'S' ? ses_id : src[i + 1] == 'M' ? run_id : src[i + 1] == 'P' ? smp_id : NULL;
        if (rep) {
            size_t k = strlen(rep);
            if (len + k + 4 >= cap) break;
            memcpy(dst + len, rep, k);
            len += k;
            i++;
            continue;
        }
        unsigned char ch = src[i];
        if (url && !((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                     strchr("-._~/?=&:", ch)))
            len += (size_t)snprintf(dst + len, cap - len, "%%%02X", ch);
        else
            dst[len++] = (char)ch;
    }
    dst[len] = 0;
    return len;
}

static char req_buf[1 << 17], resp_buf[1 << 14];

/* Sends one request to the service; the response (head and start of the body) in resp_buf. */
static void send_req(const char *method, const char *route, const uint8_t *body, size_t blen) {
    char path[2048];
    expand(path, 0, sizeof path, (const uint8_t *)route, strlen(route), 1);
    char head[2300];
    size_t hl = (size_t)snprintf(head, sizeof head, "%s /api/v1/%s HTTP/1.1\r\nHost: f\r\nX-API-Key: tml-fuzz\r\n", method,
                                 path);
    static char exp_body[1 << 16];
    size_t el = expand(exp_body, 0, sizeof exp_body, body, blen, 0);
    size_t n = (size_t)snprintf(req_buf, sizeof req_buf, "%sContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                                head, el);
    (void)hl;
    memcpy(req_buf + n, exp_body, el);
    twk_fuzz_drive(&loop, S->http, (const uint8_t *)req_buf, n + el, 0, resp_buf, sizeof resp_buf);
}

/* The string field `key` of the JSON body of resp_buf into out. */
static void resp_field(const char *key, char *out, size_t cap) {
    const char *b = strstr(resp_buf, "\r\n\r\n");
    cJSON *j = b ? cJSON_Parse(b + 4) : NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsString(v)) {
        fprintf(stderr, "fuzz_json: setup: no '%s' in %s\n", key, resp_buf);
        abort();
    }
    snprintf(out, cap, "%s", v->valuestring);
    cJSON_Delete(j);
}

static void pump(double seconds) {
    for (int i = 0; i < (int)(seconds * 1000); i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
}

/* OpenBLAS's exit handler can wait forever on a pool thread once the worker
 * thread has run a GEMM; libFuzzer exits through exit() only when it has
 * nothing to report, so leave right there (errors take _Exit paths). */
static void leave_now(void) { _exit(0); }

static void setup(void) {
    atexit(leave_now);
    uv_loop_init(&loop);
    S = calloc(1, sizeof *S);
    twk_serve_config_default(&S->cfg);
    snprintf(S->cfg.data_dir, sizeof S->cfg.data_dir, "%s/data", twk_fuzz_tmpdir());
    S->cfg.max_context = 16;
    S->cfg.max_datums = 4;
    S->cfg.max_lora_rank = 2;
    S->cfg.poll_timeout_s = 0.05;
    S->cfg.seq_timeout_s = 2;
    S->cfg.quiet = 1;
    S->loop = &loop;
    base_model *b = &S->models[0];
    snprintf(b->name, sizeof b->name, "%s", TWK_DEFAULT_MODEL_NAME);
    if (twk_store_open(S->cfg.data_dir, &S->store) != TWK_OK || twk_auth_load("", &S->auth) != TWK_OK ||
        twk_device_open("cpu", &S->dev) != TWK_OK ||
        twk_serve_default_model(S->cfg.data_dir, b->dir, sizeof b->dir) != TWK_OK ||
        twk_model_load(b->dir, S->dev, &b->m) != TWK_OK) {
        fprintf(stderr, "fuzz_json: setup: %s\n", twk_last_error());
        abort();
    }
    S->n_models = 1;
    twk_futures_limits fl = twk_futures_limits_default();
    fl.poll_timeout_s = S->cfg.poll_timeout_s;
    S->futures = twk_futures_new(&loop, &fl);
    S->stab = twk_stab_new(S->cfg.stability_ttl_s, S->cfg.stability_records);
    api_json_hooks();
    S->worker = twk_worker_start(&loop);
    twk_http_limits lim = twk_http_limits_default();
    lim.max_body_bytes = 1 << 16;
    if (!S->futures || !S->worker || svc_metrics_open(S) != 0 ||
        twk_http_server_start(&loop, "127.0.0.1", 0, &lim, svc_handle, S, &S->http) != 0)
        abort();
    svc_metrics_attach(S); /* the metrics' hooks run on every answer and op, as in serve */
    static const char cs[] = "{\"tags\":[],\"user_metadata\":{},\"sdk_version\":\"0.38.0\",\"type\":\"create_session\"}";
    send_req("POST", "create_session", (const uint8_t *)cs, sizeof cs - 1);
    resp_field("session_id", ses_id, sizeof ses_id);
    char body[512];
    int n = snprintf(body, sizeof body,
                     "{\"session_id\":\"%s\",\"model_seq_id\":0,\"base_model\":\"%s\",\"lora_config\":{\"rank\":2}}",
                     ses_id, TWK_DEFAULT_MODEL_NAME);
    send_req("POST", "create_model", (const uint8_t *)body, (size_t)n);
    resp_field("model_id", run_id, sizeof run_id);
    n = snprintf(body, sizeof body, "{\"session_id\":\"%s\",\"sampling_session_seq_id\":0,\"base_model\":\"%s\"}", ses_id,
                 TWK_DEFAULT_MODEL_NAME);
    send_req("POST", "create_sampling_session", (const uint8_t *)body, (size_t)n);
    resp_field("sampling_session_id", smp_id, sizeof smp_id);
    pump(1.0); /* the run's creation on the worker */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!S) setup();
    if (size == 0) return 0;
    unsigned pick = data[0] % (N_POST + N_REST);
    data++;
    size--;
    if (pick < N_POST) {
        send_req("POST", post_routes[pick], data, size);
    } else {
        const char *r = rest_routes[pick - N_POST], *sp = strchr(r, ' ');
        char method[8], route[1024];
        snprintf(method, sizeof method, "%.*s", (int)(sp - r), r);
        const uint8_t *nl = memchr(data, '\n', size);
        size_t pl = nl ? (size_t)(nl - data) : 0;
        snprintf(route, sizeof route, "%s%.*s", sp + 1, (int)(pl < 512 ? pl : 512), (const char *)data);
        send_req(method, route, nl ? nl + 1 : data, nl ? size - pl - 1 : size);
    }
    uv_run(&loop, UV_RUN_NOWAIT); /* worker results of earlier inputs */
    return 0;
}
