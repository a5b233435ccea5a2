// byom sandbox guest: QuickJS (quickjs-ng) behind a tiny interface the host
// drives. The guest has the language and nothing else; every capability is
// a host import. All guest state lives in linear memory (plus the
// __stack_pointer global), so the host can snapshot and restore it.
//
// Exports (all return <0 on a guest-side failure):
//   byom_alloc/byom_free      buffers for the host to pass strings in
//   byom_init(mem, stack)     runtime + context with limits
//   byom_register(ns,fn,cap)  globalThis[ns][fn] = async (args) => host call
//   byom_seal()               freeze the capability namespaces
//   byom_eval(src)            start a script (top-level await allowed)
//   byom_poll()               run jobs: 0 settled, 1 waiting on host calls
//   byom_settle(id,ok,json)   resolve (ok=1, JSON) or reject (ok=0, message)
//   byom_result_*             the settled outcome: kind, bytes
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quickjs.h"

#define IMPORT(name) __attribute__((import_module("byom"), import_name(name)))
#define EXPORT(name) __attribute__((export_name(name)))

// Registers a host call; returns its id (>= 0) or < 0 if the host refused it
// (the host then ends the eval with its own error).
IMPORT("host_call") int32_t host_call(uint32_t cap, const char *args, uint32_t len);
// console.log; returns nonzero when the output limit is crossed.
IMPORT("host_log") int32_t host_log(uint32_t level, const char *msg, uint32_t len);
// Interrupt poll: nonzero stops the script (wall clock, cancellation).
IMPORT("host_interrupt") int32_t host_interrupt(void);

enum { RESULT_NONE = 0, RESULT_OK = 1, RESULT_EXCEPTION = 2, RESULT_SYNTAX = 3, RESULT_INTERRUPTED = 4, RESULT_OOM = 5, RESULT_STACK = 6, RESULT_HOST = 7 };

static JSRuntime *rt;
static JSContext *ctx;
static JSValue eval_promise;
static int have_eval;
static char *result_buf;
static uint32_t result_len;
static int32_t result_kind;
static int host_stop; // the host refused something: end the eval

// Pending host calls: id -> resolving functions.
typedef struct { int32_t id; JSValue resolve, reject; } pending_t;
static pending_t *pending;
static uint32_t npending, cappending;

EXPORT("byom_alloc") void *byom_alloc(uint32_t n) { return malloc(n ? n : 1); }
EXPORT("byom_free") void byom_free(void *p) { free(p); }

static int interrupt_cb(JSRuntime *r, void *opaque) {
    (void)r; (void)opaque;
    return host_stop || host_interrupt() != 0;
}

static void set_result(int32_t kind, const char *s, size_t len) {
    free(result_buf);
    result_buf = malloc(len + 1);
    if (!result_buf) { result_len = 0; result_kind = RESULT_OOM; return; }
    memcpy(result_buf, s, len);
    result_buf[len] = 0;
    result_len = (uint32_t)len;
    result_kind = kind;
}

static void set_result_str(int32_t kind, const char *s) { set_result(kind, s, strlen(s)); }

// Describes the pending exception (message + stack) as the result.
static void take_exception(void) {
    JSValue e = JS_GetException(ctx);
    int32_t kind = RESULT_EXCEPTION;
    if (JS_IsUncatchableError(e)) kind = RESULT_INTERRUPTED;
    const char *msg = NULL;
    size_t len = 0;
    JSValue stack = JS_UNDEFINED;
    if (JS_IsError(e)) {
        JSValue name = JS_GetPropertyStr(ctx, e, "name");
        const char *n = JS_ToCString(ctx, name);
        if (n && strcmp(n, "SyntaxError") == 0) kind = RESULT_SYNTAX;
        if (n && strcmp(n, "RangeError") == 0) {
            JSValue m = JS_GetPropertyStr(ctx, e, "message");
            const char *ms = JS_ToCString(ctx, m);
            if (ms && strstr(ms, "call stack")) kind = RESULT_STACK;
            if (ms) JS_FreeCString(ctx, ms);
            JS_FreeValue(ctx, m);
        }
        if (n && strcmp(n, "InternalError") == 0) {
            JSValue m = JS_GetPropertyStr(ctx, e, "message");
            const char *ms = JS_ToCString(ctx, m);
            if (ms && strstr(ms, "out of memory")) kind = RESULT_OOM;
            if (ms && strstr(ms, "interrupted")) kind = RESULT_INTERRUPTED;
            if (ms) JS_FreeCString(ctx, ms);
            JS_FreeValue(ctx, m);
        }
        if (n) JS_FreeCString(ctx, n);
        JS_FreeValue(ctx, name);
        stack = JS_GetPropertyStr(ctx, e, "stack");
    }
    if (JS_IsNull(e) && kind == RESULT_EXCEPTION) {
        // QuickJS throws null when it cannot even allocate the error.
        kind = RESULT_OOM;
    }
    msg = JS_ToCStringLen(ctx, &len, e);
    if (!msg) {
        set_result_str(kind == RESULT_EXCEPTION ? RESULT_OOM : kind, "out of memory while describing an exception");
    } else {
        const char *st = JS_IsString(stack) ? JS_ToCString(ctx, stack) : NULL;
        if (st && *st) {
            size_t sl = strlen(st);
            char *buf = malloc(len + 1 + sl + 1);
            if (buf) {
                memcpy(buf, msg, len);
                buf[len] = '\n';
                memcpy(buf + len + 1, st, sl);
                set_result(kind, buf, len + 1 + sl);
                free(buf);
            } else {
                set_result(kind, msg, len);
            }
        } else {
            set_result(kind, msg, len);
        }
        if (st) JS_FreeCString(ctx, st);
        JS_FreeCString(ctx, msg);
    }
    if (host_stop) result_kind = RESULT_HOST;
    JS_FreeValue(ctx, stack);
    JS_FreeValue(ctx, e);
}

static JSValue js_console_log(JSContext *c, JSValueConst this_val, int argc, JSValueConst *argv, int magic) {
    (void)this_val;
    size_t cap = 256, used = 0;
    char *buf = malloc(cap);
    if (!buf) return JS_ThrowOutOfMemory(c);
    for (int i = 0; i < argc; i++) {
        size_t len;
        const char *s;
        JSValue tmp = JS_UNDEFINED;
        if (JS_IsString(argv[i]) || JS_IsUndefined(argv[i]) || JS_IsFunction(c, argv[i]) || JS_IsSymbol(argv[i]) || JS_IsError(argv[i])) {
            s = JS_ToCStringLen(c, &len, argv[i]);
        } else {
            tmp = JS_JSONStringify(c, argv[i], JS_UNDEFINED, JS_UNDEFINED);
            if (JS_IsException(tmp)) {
                JS_FreeValue(c, JS_GetException(c));
                s = JS_ToCStringLen(c, &len, argv[i]);
            } else if (JS_IsUndefined(tmp)) {
                s = JS_ToCStringLen(c, &len, argv[i]);
            } else {
                s = JS_ToCStringLen(c, &len, tmp);
            }
        }
        JS_FreeValue(c, tmp);
        if (!s) { free(buf); return JS_EXCEPTION; }
        if (used + len + 2 > cap) {
            while (used + len + 2 > cap) cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) { JS_FreeCString(c, s); free(buf); return JS_ThrowOutOfMemory(c); }
            buf = nb;
        }
        if (i) buf[used++] = ' ';
        memcpy(buf + used, s, len);
        used += len;
        JS_FreeCString(c, s);
    }
    int32_t stop = host_log((uint32_t)magic, buf, (uint32_t)used);
    free(buf);
    if (stop) {
        host_stop = 1;
        return JS_ThrowInternalError(c, "output limit exceeded");
    }
    return JS_UNDEFINED;
}

static int add_pending(int32_t id, JSValue *funcs) {
    if (npending == cappending) {
        uint32_t ncap = cappending ? cappending * 2 : 16;
        pending_t *np = realloc(pending, ncap * sizeof(pending_t));
        if (!np) return -1;
        pending = np;
        cappending = ncap;
    }
    pending[npending].id = id;
    pending[npending].resolve = funcs[0];
    pending[npending].reject = funcs[1];
    npending++;
    return 0;
}

// globalThis[ns][fn](arg): JSON-encode arg, hand it to the host, return a
// promise the host settles later via byom_settle.
static JSValue js_host_fn(JSContext *c, JSValueConst this_val, int argc, JSValueConst *argv, int magic, JSValueConst *data) {
    (void)this_val; (void)magic;
    int32_t cap;
    if (JS_ToInt32(c, &cap, data[0])) return JS_EXCEPTION;
    JSValue arg = argc > 0 ? argv[0] : JS_NULL;
    JSValue json = JS_JSONStringify(c, arg, JS_UNDEFINED, JS_UNDEFINED);
    if (JS_IsException(json)) return JS_EXCEPTION;
    const char *s = "null";
    size_t len = 4;
    int owned = 0;
    if (!JS_IsUndefined(json)) {
        s = JS_ToCStringLen(c, &len, json);
        owned = 1;
    }
    JS_FreeValue(c, json);
    if (!s) return JS_EXCEPTION;
    JSValue funcs[2];
    JSValue promise = JS_NewPromiseCapability(c, funcs);
    if (JS_IsException(promise)) {
        if (owned) JS_FreeCString(c, s);
        return promise;
    }
    int32_t id = host_call((uint32_t)cap, s, (uint32_t)len);
    if (owned) JS_FreeCString(c, s);
    if (id < 0 || add_pending(id, funcs) < 0) {
        JS_FreeValue(c, funcs[0]);
        JS_FreeValue(c, funcs[1]);
        JS_FreeValue(c, promise);
        host_stop = 1;
        return JS_ThrowInternalError(c, "capability call refused by the host");
    }
    return promise;
}

EXPORT("byom_init") int32_t byom_init(uint32_t mem_limit, uint32_t stack_size) {
    rt = JS_NewRuntime();
    if (!rt) return -1;
    if (mem_limit) JS_SetMemoryLimit(rt, mem_limit);
    JS_SetMaxStackSize(rt, stack_size);
    JS_SetInterruptHandler(rt, interrupt_cb, NULL);
    ctx = JS_NewContext(rt);
    if (!ctx) return -2;
    JSValue global = JS_GetGlobalObject(ctx);
    JSValue console = JS_NewObject(ctx);
    JS_SetPropertyStr(ctx, console, "log", JS_NewCFunctionMagic(ctx, js_console_log, "log", 1, JS_CFUNC_generic_magic, 0));
    JS_SetPropertyStr(ctx, console, "info", JS_NewCFunctionMagic(ctx, js_console_log, "info", 1, JS_CFUNC_generic_magic, 0));
    JS_SetPropertyStr(ctx, console, "warn", JS_NewCFunctionMagic(ctx, js_console_log, "warn", 1, JS_CFUNC_generic_magic, 1));
    JS_SetPropertyStr(ctx, console, "error", JS_NewCFunctionMagic(ctx, js_console_log, "error", 1, JS_CFUNC_generic_magic, 1));
    JS_FreezeObject(ctx, console);
    JS_DefinePropertyValueStr(ctx, global, "console", console, 0);
    JS_FreeValue(ctx, global);
    return 0;
}

EXPORT("byom_register") int32_t byom_register(const char *ns, uint32_t ns_len, const char *fn, uint32_t fn_len, uint32_t cap) {
    char nsz[64], fnz[64];
    if (ns_len >= sizeof nsz || fn_len >= sizeof fnz) return -1;
    memcpy(nsz, ns, ns_len); nsz[ns_len] = 0;
    memcpy(fnz, fn, fn_len); fnz[fn_len] = 0;
    JSValue global = JS_GetGlobalObject(ctx);
    JSValue obj = JS_GetPropertyStr(ctx, global, nsz);
    if (JS_IsUndefined(obj)) {
        obj = JS_NewObject(ctx);
        JS_DefinePropertyValueStr(ctx, global, nsz, JS_DupValue(ctx, obj), 0);
    }
    JSValue data = JS_NewInt32(ctx, (int32_t)cap);
    JSValue f = JS_NewCFunctionData(ctx, js_host_fn, 1, 0, 1, &data);
    int r = JS_DefinePropertyValueStr(ctx, obj, fnz, f, JS_PROP_ENUMERABLE);
    JS_FreeValue(ctx, obj);
    JS_FreeValue(ctx, global);
    return r < 0 ? -2 : 0;
}

// Freezes every capability namespace so scripts cannot swap the bridge.
EXPORT("byom_seal") int32_t byom_seal(const char *ns, uint32_t ns_len) {
    char nsz[64];
    if (ns_len >= sizeof nsz) return -1;
    memcpy(nsz, ns, ns_len); nsz[ns_len] = 0;
    JSValue global = JS_GetGlobalObject(ctx);
    JSValue obj = JS_GetPropertyStr(ctx, global, nsz);
    int r = JS_FreezeObject(ctx, obj);
    JS_FreeValue(ctx, obj);
    JS_FreeValue(ctx, global);
    return r < 0 ? -2 : 0;
}

EXPORT("byom_eval") int32_t byom_eval(const char *src, uint32_t len) {
    if (have_eval) { JS_FreeValue(ctx, eval_promise); have_eval = 0; }
    host_stop = 0;
    result_kind = RESULT_NONE;
    // QuickJS needs a NUL after the source.
    char *copy = malloc(len + 1);
    if (!copy) { set_result_str(RESULT_OOM, "out of memory"); return -1; }
    memcpy(copy, src, len);
    copy[len] = 0;
    JSValue v = JS_Eval(ctx, copy, len, "<script>", JS_EVAL_TYPE_GLOBAL | JS_EVAL_FLAG_ASYNC);
    free(copy);
    if (JS_IsException(v)) { take_exception(); return 1; }
    eval_promise = v;
    have_eval = 1;
    return 0;
}

static void finish_ok(JSValue value) {
    // Async global eval resolves to { value: <completion value> }.
    JSValue inner = JS_IsObject(value) ? JS_GetPropertyStr(ctx, value, "value") : JS_DupValue(ctx, value);
    JSValue json = JS_JSONStringify(ctx, inner, JS_UNDEFINED, JS_UNDEFINED);
    JS_FreeValue(ctx, inner);
    if (JS_IsException(json)) { take_exception(); return; }
    if (JS_IsUndefined(json)) { set_result_str(RESULT_OK, "null"); return; }
    size_t len;
    const char *s = JS_ToCStringLen(ctx, &len, json);
    JS_FreeValue(ctx, json);
    if (!s) { take_exception(); return; }
    set_result(RESULT_OK, s, len);
    JS_FreeCString(ctx, s);
}

// Runs jobs until none are left. 0: the eval settled (see byom_result_*);
// 1: it waits on host calls.
EXPORT("byom_poll") int32_t byom_poll(void) {
    if (!have_eval) return 0;
    for (;;) {
        JSContext *c;
        int r = JS_ExecutePendingJob(rt, &c);
        if (r < 0) {
            // An exception in a job (e.g. interrupted): it ends the eval.
            take_exception();
            JS_FreeValue(ctx, eval_promise);
            have_eval = 0;
            return 0;
        }
        if (r == 0) break;
        if (host_stop) break;
    }
    JSPromiseStateEnum st = JS_PromiseState(ctx, eval_promise);
    if (st == JS_PROMISE_PENDING && !host_stop) return 1;
    if (st == JS_PROMISE_FULFILLED) {
        JSValue v = JS_PromiseResult(ctx, eval_promise);
        finish_ok(v);
        JS_FreeValue(ctx, v);
    } else if (st == JS_PROMISE_REJECTED) {
        JSValue v = JS_PromiseResult(ctx, eval_promise);
        JS_Throw(ctx, v);
        take_exception();
    } else {
        set_result_str(RESULT_HOST, "stopped by the host");
    }
    JS_FreeValue(ctx, eval_promise);
    have_eval = 0;
    return 0;
}

EXPORT("byom_settle") int32_t byom_settle(int32_t id, int32_t ok, const char *json, uint32_t len) {
    for (uint32_t i = 0; i < npending; i++) {
        if (pending[i].id != id) continue;
        pending_t p = pending[i];
        pending[i] = pending[--npending];
        JSValue arg;
        if (ok) {
            arg = JS_ParseJSON(ctx, json, len, "<host>");
            if (JS_IsException(arg)) {
                JS_FreeValue(ctx, JS_GetException(ctx));
                arg = JS_NewError(ctx);
                JS_SetPropertyStr(ctx, arg, "message", JS_NewString(ctx, "the host returned invalid JSON"));
                ok = 0;
            }
        } else {
            arg = JS_NewError(ctx);
            JS_SetPropertyStr(ctx, arg, "message", JS_NewStringLen(ctx, json, len));
        }
        JSValue r = JS_Call(ctx, ok ? p.resolve : p.reject, JS_UNDEFINED, 1, &arg);
        JS_FreeValue(ctx, r);
        JS_FreeValue(ctx, arg);
        JS_FreeValue(ctx, p.resolve);
        JS_FreeValue(ctx, p.reject);
        return 0;
    }
    return -1;
}

EXPORT("byom_result_kind") int32_t byom_result_kind(void) { return result_kind; }
EXPORT("byom_result_ptr") const char *byom_result_ptr(void) { return result_buf; }
EXPORT("byom_result_len") uint32_t byom_result_len(void) { return result_len; }
EXPORT("byom_pending_count") uint32_t byom_pending_count(void) { return npending; }
