/*
 * The C-path baseline of bench_overhead.py: exactly the work the Python benchmark times, done
 * from C against the same library. bench_overhead.py compiles this file with `cc` and runs it
 * in the same run; it is not part of the package.
 *
 *   c_path N REPS
 *
 * N tensors of 4x4 float32 in one contiguous buffer, named like a MoE checkpoint's, described
 * with the strides torch reports; one shm strategy (one receiver, two buckets, checksums off).
 * Each repetition: send the chunk as one request (copied once, as a controller would keep the
 * bytes), receive it, take every view, end the iteration; and, separately, plan the tensors.
 * Prints the medians in microseconds per tensor as JSON.
 */
#include <wsync.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check(wsync_status_t status, const char *what) {
    if (status != WSYNC_OK) {
        fprintf(stderr, "c_path: %s failed: %s: %s\n", what, wsync_status_string(status),
                wsync_last_error());
        exit(1);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_us_per_tensor(double *samples, int reps, size_t n) {
    qsort(samples, (size_t)reps, sizeof(double), cmp_double);
    double m = reps % 2 ? samples[reps / 2] : (samples[reps / 2 - 1] + samples[reps / 2]) / 2;
    return m / (double)n * 1e6;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: c_path N REPS\n");
        return 2;
    }
    size_t n = (size_t)strtoull(argv[1], NULL, 10);
    int reps = atoi(argv[2]);
    if (n == 0 || reps <= 0) return 2;

    float *data = malloc(n * 16 * sizeof(float));
    char (*names)[64] = malloc(n * sizeof *names);
    wsync_tensor_t *tensors = calloc(n, sizeof *tensors);
    double *send = malloc((size_t)reps * sizeof(double));
    double *recv = malloc((size_t)reps * sizeof(double));
    double *plan = malloc((size_t)reps * sizeof(double));
    if (!data || !names || !tensors || !send || !recv || !plan) return 1;
    static const int64_t shape[2] = {4, 4};
    static const int64_t strides[2] = {4, 1};
    for (size_t i = 0; i < n * 16; ++i) data[i] = 1.0f;
    for (size_t i = 0; i < n; ++i) {
        snprintf(names[i], sizeof names[i], "model.layers.%zu.mlp.experts.%zu.weight", i / 16,
                 i % 16);
        tensors[i].name = names[i];
        tensors[i].data = data + 16 * i;
        tensors[i].shape = shape;
        tensors[i].strides = strides;
        tensors[i].ndim = 2;
        tensors[i].dtype = (wsync_dtype_t){WSYNC_DTYPE_FLOAT, 32, 1};
        tensors[i].device = (wsync_device_t){WSYNC_DEVICE_CPU, 0};
        tensors[i].struct_size = sizeof(wsync_tensor_t); /* the 0.2 layout, as the header asks */
    }

    size_t bucket = (n * 256 + 4095) / 4096 * 4096;
    char options[256];
    snprintf(options, sizeof options,
             "{\"receivers\": 1, \"buckets\": 2, \"bucket_bytes\": %zu, \"checksum\": false, "
             "\"timeout_ms\": 10000}", bucket);
    wsync_strategy_t *trainer, *engine;
    wsync_blob_t init;
    wsync_sender_t *sender;
    wsync_receiver_t *receiver;
    check(wsync_strategy_create("shm", options, &trainer), "strategy");
    check(wsync_strategy_create("shm", "{\"verify\": false}", &engine), "engine strategy");
    check(wsync_strategy_create_init_info(trainer, &init), "init info");
    check(wsync_sender_create(trainer, init.data, init.size, &sender), "sender");
    check(wsync_receiver_create(engine, init.data, init.size, 0, &receiver), "receiver");

    wsync_chunk_t chunk = {tensors, n, WSYNC_CHUNK_LAST, sizeof(wsync_chunk_t)};
    for (int rep = -2; rep < reps; ++rep) { /* two warm-up rounds, as the Python side does */
        double t0 = now_s();
        wsync_blob_t request;
        check(wsync_sender_send_chunk(sender, &chunk, &request), "send");
        uint8_t *copy = malloc(request.size);
        memcpy(copy, request.data, request.size);
        size_t len = request.size;
        wsync_blob_free(&request);
        double t1 = now_s();
        wsync_recv_t *it;
        check(wsync_receiver_receive(receiver, copy, len, &it), "receive");
        wsync_recv_info_t info = {.struct_size = sizeof(wsync_recv_info_t)};
        check(wsync_recv_info(it, &info), "info");
        wsync_tensor_t view;
        bool has = true;
        size_t count = 0;
        for (;;) {
            check(wsync_recv_next(it, &view, &has), "next");
            if (!has) break;
            ++count;
        }
        if (count != n || info.count != n) {
            /* A loader that finds something wrong after its last view fails the chunk, so the
             * trainer's flush reports it (wsync_recv_fail frees the iteration). */
            fprintf(stderr, "c_path: got %zu of %zu views\n", count, n);
            wsync_recv_fail(it, WSYNC_ERR_MISMATCH, "c_path: wrong number of views");
            return 1;
        }
        check(wsync_recv_end(it), "end");
        double t2 = now_s();
        free(copy);
        if (rep >= 0) {
            send[rep] = t1 - t0;
            recv[rep] = t2 - t1;
        }
    }
    check(wsync_sender_flush(sender, 10000), "flush");
    for (int rep = 0; rep < reps; ++rep) {
        double t0 = now_s();
        wsync_plan_t *p;
        check(wsync_plan_create(tensors, n, "{\"chunk_bytes\": 1099511627776}", &p), "plan");
        wsync_plan_destroy(p);
        plan[rep] = now_s() - t0;
    }
    wsync_receiver_destroy(receiver);
    wsync_sender_destroy(sender);
    wsync_strategy_destroy(engine);
    wsync_strategy_destroy(trainer);
    wsync_blob_free(&init);

    printf("{\"library\": \"%s\", \"tensors\": %zu, \"reps\": %d, \"send_us\": %.4f, "
           "\"receive_iterate_us\": %.4f, \"plan_us\": %.4f}\n",
           wsync_version_string(), n, reps, median_us_per_tensor(send, reps, n),
           median_us_per_tensor(recv, reps, n), median_us_per_tensor(plan, reps, n));
    free(data);
    free(names);
    free(tensors);
    free(send);
    free(recv);
    free(plan);
    return 0;
}
