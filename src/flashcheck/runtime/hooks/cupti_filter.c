/* The cupti layer's CUPTI callback, in C: it answers the common case of an engine's replay path (an asynchronous
 * copy from pinned host memory, a device-to-device copy, the exit of a call, the driver call inside a runtime call
 * already seen) without entering Python, and hands every other watched call to Python (`forward`), which takes the
 * stack and decides. flashcheck compiles it on first use (runtime/hooks/cupti_native.py); it includes no CUDA or
 * CUPTI header: the few layouts it reads are declared below, as CUPTI and the CUDA runtime document them.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* CUpti_CallbackData (cupti_callbacks.h): what CUPTI passes for a runtime or driver API callback. */
typedef struct {
    int callback_site; /* CUpti_ApiCallbackSite: 0 API_ENTER, 1 API_EXIT */
    const char *function_name;
    const void *function_params;
    void *function_return_value;
    const char *symbol_name;
    void *context;
    uint32_t context_uid;
    uint64_t *correlation_data;
    uint32_t correlation_id;
} fc_callback_data;

/* cudaMemcpyAsync_v3020_params (generated_cuda_runtime_api_meta.h). */
typedef struct {
    uint64_t dst;
    uint64_t src;
    size_t count;
    int kind; /* cudaMemcpyKind */
    void *stream;
} fc_memcpy_async_params;

/* CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) */
typedef int (*fc_get_attribute)(void *data, int attribute, uint64_t ptr);
/* the Python side: (domain, callback id, correlation id, parameter struct) of a call it has to look at */
typedef void (*fc_forward)(int domain, uint32_t cbid, uint32_t correlation, const void *params);

enum { FC_NONE = 0, FC_SYNC = 1, FC_COPY = 2 };
enum { FC_DOMAINS = 2, FC_IDS = 4096, FC_PINNED_SLOTS = 8192, FC_PINNED_MAX = 4096 };
enum { MEMCPY_HOST_TO_DEVICE = 1, MEMCPY_DEVICE_TO_HOST = 2, MEMCPY_DEFAULT = 4 };
enum { ATTRIBUTE_MEMORY_TYPE = 2, MEMORYTYPE_HOST = 1, MEMORYTYPE_DEVICE = 2 };

static unsigned char calls[FC_DOMAINS][FC_IDS]; /* driver (1) and runtime (2) domains: FC_* per callback id */
/* Shared between the threads that make CUDA calls: published with release stores, read with acquire loads. */
static fc_forward forward_fn;
static fc_get_attribute get_attribute_fn;
static uint64_t pinned[FC_PINNED_SLOTS]; /* host addresses the driver said are pinned (open addressing, 0 empty) */
static int pinned_count;
static __thread uint32_t last_correlation; /* of the last call this thread made that the filter looked at */
static uint64_t forwarded, answered;       /* calls handed to Python, calls answered here */

static void clear_pinned(void) {
    for (size_t i = 0; i < FC_PINNED_SLOTS; i++) __atomic_store_n(&pinned[i], 0, __ATOMIC_RELAXED);
}

void fc_set_call(int domain, uint32_t cbid, int what) {
    if (domain >= 1 && domain <= FC_DOMAINS && cbid < FC_IDS) calls[domain - 1][cbid] = (unsigned char)what;
}

/* Called before the callback ids are enabled (fc_set_call) and before CUPTI calls back: a stopped filter first. */
void fc_reset(fc_forward forward, fc_get_attribute get_attribute) {
    __atomic_store_n(&forward_fn, (fc_forward)NULL, __ATOMIC_RELEASE);
    memset(calls, 0, sizeof calls);
    clear_pinned();
    __atomic_store_n(&pinned_count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&forwarded, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&answered, 0, __ATOMIC_RELAXED);
    last_correlation = 0; /* the calling thread's; CUPTI's correlation ids only grow, so the others' never match */
    __atomic_store_n(&get_attribute_fn, get_attribute, __ATOMIC_RELEASE);
    __atomic_store_n(&forward_fn, forward, __ATOMIC_RELEASE);
}

void fc_stop(void) { __atomic_store_n(&forward_fn, (fc_forward)NULL, __ATOMIC_RELEASE); }

uint64_t fc_forwarded(void) { return __atomic_load_n(&forwarded, __ATOMIC_RELAXED); }
uint64_t fc_answered(void) { return __atomic_load_n(&answered, __ATOMIC_RELAXED); }

static size_t slot_of(uint64_t ptr) { return (size_t)((ptr >> 4) * 0x9E3779B97F4A7C15ull >> 51) & (FC_PINNED_SLOTS - 1); }

static int known_pinned(uint64_t ptr) {
    for (size_t i = slot_of(ptr), n = 0; n < FC_PINNED_SLOTS; i = (i + 1) & (FC_PINNED_SLOTS - 1), n++) {
        uint64_t v = __atomic_load_n(&pinned[i], __ATOMIC_RELAXED);
        if (v == ptr) return 1;
        if (v == 0) return 0;
    }
    return 0;
}

static void remember_pinned(uint64_t ptr) {
    /* Threads race here at worst into a lost entry or a cleared table: the address is asked again, never wrong. */
    if (__atomic_add_fetch(&pinned_count, 1, __ATOMIC_RELAXED) > FC_PINNED_MAX) {
        clear_pinned();
        __atomic_store_n(&pinned_count, 1, __ATOMIC_RELAXED);
    }
    for (size_t i = slot_of(ptr), n = 0; n < FC_PINNED_SLOTS; i = (i + 1) & (FC_PINNED_SLOTS - 1), n++) {
        uint64_t expected = 0;
        if (__atomic_compare_exchange_n(&pinned[i], &expected, ptr, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
        if (expected == ptr) return;
    }
}

/* CU_MEMORYTYPE_* of an address; 0 for memory the driver does not know (pageable); -1 when it cannot say. */
static int memory_type(fc_get_attribute get_attribute, uint64_t ptr) {
    unsigned int kind = 0;
    int err = get_attribute(&kind, ATTRIBUTE_MEMORY_TYPE, ptr);
    if (err == 1) return 0; /* CUDA_ERROR_INVALID_VALUE: an address the driver does not know */
    return err == 0 ? (int)kind : -1;
}

/* A null address (0 marks an empty slot) is never known pinned: the driver is asked, as for any address. */
static int pinned_host(fc_get_attribute get_attribute, uint64_t ptr) {
    if (ptr != 0 && known_pinned(ptr)) return 1;
    if (get_attribute == NULL || memory_type(get_attribute, ptr) != MEMORYTYPE_HOST) return 0;
    if (ptr != 0) remember_pinned(ptr);
    return 1;
}

/* Whether an asynchronous copy is one the layer never reports: host-to-device from pinned memory (it runs
 * asynchronously, as a replay path should), or neither side on the host. Device-to-host copies, pageable sources and
 * whatever the driver cannot classify go to Python. */
static int harmless_copy(const fc_memcpy_async_params *p) {
    fc_get_attribute get_attribute = __atomic_load_n(&get_attribute_fn, __ATOMIC_ACQUIRE);
    switch (p->kind) {
    case MEMCPY_HOST_TO_DEVICE:
        return pinned_host(get_attribute, p->src);
    case MEMCPY_DEVICE_TO_HOST:
        return 0;
    case MEMCPY_DEFAULT: {
        if (get_attribute == NULL) return 0;
        int dst = memory_type(get_attribute, p->dst), src = memory_type(get_attribute, p->src);
        if (dst < 0 || src < 0) return 0;
        if (dst == MEMORYTYPE_DEVICE && src != MEMORYTYPE_DEVICE) return pinned_host(get_attribute, p->src);
        if (src == MEMORYTYPE_DEVICE && dst != MEMORYTYPE_DEVICE) return 0;
        return 1;
    }
    default: /* host to host, device to device */
        return 1;
    }
}

/* The CUPTI callback (CUpti_CallbackFunc). */
void fc_callback(void *userdata, int domain, uint32_t cbid, const void *data) {
    (void)userdata;
    const fc_callback_data *d = (const fc_callback_data *)data;
    fc_forward forward = __atomic_load_n(&forward_fn, __ATOMIC_ACQUIRE);
    if (forward == NULL || d->callback_site != 0 || domain < 1 || domain > FC_DOMAINS || cbid >= FC_IDS) return;
    int what = calls[domain - 1][cbid];
    if (what == FC_NONE) return;
    uint32_t correlation = d->correlation_id;
    if (correlation != 0 && correlation == last_correlation) return; /* the driver call inside a runtime call */
    last_correlation = correlation;
    if (what == FC_COPY && harmless_copy((const fc_memcpy_async_params *)d->function_params)) {
        __atomic_fetch_add(&answered, 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_fetch_add(&forwarded, 1, __ATOMIC_RELAXED);
    forward(domain, cbid, correlation, d->function_params);
}
