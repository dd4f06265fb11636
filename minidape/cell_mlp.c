/* The refiners' cell MLP in one pass over the cells, for float32 on the CPU (minidape/native.py loads it).

   At every cell n of every sequence b, with x the cell's per-sequence channels and s its channels shared by
   all sequences (DAPE's bias B, the same for every sequence):

       y[b, :, n] = W_out LeakyReLU(W_x x[b, :, n] + W_s s[:, n] + b_in)        W_in = [W_x | W_s]

   x (B, C_x, N), s (C_s, N) or none, W_in (W, C_x + C_s), b_in (W), W_out (C_out, W) -> y (B, C_out, N).

   Why C: in PyTorch the hidden layer (B, N, W) goes to memory and back between the products, whose inner
   dimension is a few heads (no matrix library is fast there). Here 8 cells at a time go through all W hidden
   units in vector registers, and the hidden layer never leaves them; backward recomputes it. The shared part
   H0 = W_s s + b_in is computed once per group of cells, not once per sequence. Channels-first x is contiguous
   along the cells: one vector load reads one channel of 8 cells.

   DAPE-V2's 1 x k convolutions (kernel = k > 0): x, s and y hold the channels once, and the MLP's channels are
   their k copies shifted along the keys, as fast_refiners.conv builds them in PyTorch: input channel t * C + c is
   channel c at key j + t - k/2 of the same row (0 outside the row or where the mask drops a cell: tril), and output
   channel t * C + c is added to channel c at key j + t - k/2. Cells are (rows, keys) per sequence.

   Each call covers the groups of 8 cells [group_begin, group_end): native.py runs disjoint ranges in parallel
   threads (whole rows when kernel > 0: the shifted outputs stay in their row), each with its own buffers for the
   weights' gradients. */

#include <stdlib.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));

enum { LANES = 8, MAX_CHANNELS = 128, MAX_WIDTH = 256, CHUNK = 4 };

struct shape {
    long batch, c_x, c_s, c_out, width, n;
    const unsigned char *mask; /* (rows, keys), 1 where attention keeps a cell; or none: every cell is read */
    long keys, reach;          /* cells per row; how many keys away an output is read (the conv's half kernel) */
    long kernel;               /* > 0: the channels are this many shifted copies (the conv); 0: as stored */
};

int cell_mlp_limits_ok(long c_x, long c_s, long c_out, long width) {
    return c_x + c_s <= MAX_CHANNELS && c_out <= MAX_CHANNELS && width <= MAX_WIDTH;
}

static inline v8 load(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline void store(float *p, v8 v) { memcpy(p, &v, sizeof(v)); }

static inline float lane_sum(v8 v) {
    float sum = 0;
    for (int i = 0; i < LANES; i++) sum += v[i];
    return sum;
}

static inline v8 where_positive(v8i positive, v8 if_positive, v8 otherwise) {
    return (v8)((positive & (v8i)if_positive) | (~positive & (v8i)otherwise));
}

/* Whether the 8 cells at n0 (one row of the mask) have no kept cell within `reach` keys: their outputs are never
   read (attention drops them), so forward writes zeros there and backward, whose incoming gradient is zero there,
   skips them. A causal block's cells past its diagonal: up to a tenth of them. */
static inline int unread(struct shape d, long n0) {
    if (!d.mask) return 0;
    long row = n0 / d.keys, key = n0 % d.keys;
    if (key + LANES > d.keys) return 0; /* the group spans two rows: computed */
    long first = key - d.reach > 0 ? key - d.reach : 0;
    long last = key + LANES - 1 + d.reach < d.keys ? key + LANES - 1 + d.reach : d.keys - 1;
    for (long j = first; j <= last; j++)
        if (d.mask[row * d.keys + j]) return 0;
    return 1;
}

/* start + sum_c w[c * stride] xs[c] in four partial sums: a chain of one sum after another would leave the
   processor waiting on each product (4 cycles each; 12 channels: 48 cycles per hidden unit), four chains do not */
static inline v8 weighted_sum(v8 start, const float *w, long stride, const v8 *xs, long count) {
    v8 partial[4] = {start, {0}, {0}, {0}};
    for (long c = 0; c < count; c++) partial[c % 4] += w[c * stride] * xs[c];
    return (partial[0] + partial[1]) + (partial[2] + partial[3]);
}

/* Channel c of 8 cells starting at cell n0 of a (channels, n) array, as a vector (zero past the end) */
static inline v8 load_cells(const float *a, long c, long n, long n0) {
    if (n0 + LANES <= n) return load(a + c * n + n0);
    float part[LANES] = {0};
    memcpy(part, a + c * n + n0, (size_t)(n - n0) * sizeof(float));
    return load(part);
}

static inline void store_cells(float *a, long c, long n, long n0, v8 v) {
    if (n0 + LANES <= n) return store(a + c * n + n0, v);
    float part[LANES];
    store(part, v);
    memcpy(a + c * n + n0, part, (size_t)(n - n0) * sizeof(float));
}

/* Whether the 8 cells at n0 and the 8 they read `shift` keys along lie whole inside one row: the common case, read
   and written as vectors; each row's first and last groups go cell by cell */
static inline int inside_row(struct shape d, long n0, long shift, long *start) {
    long key = n0 % d.keys;
    *start = n0 + shift;
    return n0 + LANES <= d.n && key + LANES <= d.keys && key + shift >= 0 && key + shift + LANES <= d.keys;
}

/* The mask's 8 bytes from `at` as lanes: all ones where the cell is kept */
static inline v8i kept(const unsigned char *at) {
    typedef unsigned char v8b __attribute__((vector_size(8)));
    v8b bytes;
    memcpy(&bytes, at, sizeof(bytes));
    return __builtin_convertvector(bytes, v8i) != 0;
}

/* Lane l < n of the 8 cells at n0 from a channel's row-major (rows, keys) cells at `shift` keys along the row:
   0 outside the row or where `mask` (if given) drops the cell read */
static inline v8 gather(const float *a, const unsigned char *mask, struct shape d, long n0, long shift) {
    long start;
    if (inside_row(d, n0, shift, &start)) {
        v8 v = load(a + start);
        return mask ? (v8)((v8i)v & kept(mask + start)) : v;
    }
    float part[LANES] = {0};
    long n = d.n - n0 < LANES ? d.n - n0 : LANES, row = n0 / d.keys, key = n0 % d.keys;
    for (long l = 0; l < n; l++) {
        long source = key + shift;
        if (source >= 0 && source < d.keys && (!mask || mask[row * d.keys + source])) part[l] = a[row * d.keys + source];
        if (++key == d.keys) key = 0, row++;
    }
    return load(part);
}

/* The transpose of `gather`: lane l added to the cell `shift` keys along its row (where `mask`, if given, keeps it) */
static inline void scatter_add(float *a, const unsigned char *mask, struct shape d, long n0, long shift, v8 v) {
    long start;
    if (inside_row(d, n0, shift, &start)) {
        store(a + start, load(a + start) + (mask ? (v8)((v8i)v & kept(mask + start)) : v));
        return;
    }
    long n = d.n - n0 < LANES ? d.n - n0 : LANES, row = n0 / d.keys, key = n0 % d.keys;
    for (long l = 0; l < n; l++) {
        long target = key + shift;
        if (target >= 0 && target < d.keys && (!mask || mask[row * d.keys + target])) a[row * d.keys + target] += v[l];
        if (++key == d.keys) key = 0, row++;
    }
}

/* The channels a tensor of `channels` MLP channels stores per sequence: one copy of the k shifted ones */
static inline long stored(struct shape d, long channels) { return d.kernel ? channels / d.kernel : channels; }

/* MLP channel c of the 8 cells at n0, from a sequence's stored channels `a` (`masked`: tril applies, as it does to
   the conv's input) */
static inline v8 read_channel(const float *a, long channels, long c, struct shape d, long n0, int masked) {
    if (!d.kernel) return load_cells(a, c, d.n, n0);
    long copy = stored(d, channels);
    return gather(a + (c % copy) * d.n, masked ? d.mask : 0, d, n0, c / copy - d.kernel / 2);
}

/* MLP channel c of the 8 cells at n0 into a sequence's stored channels: written, or with kernel > 0 added (shifted,
   where `masked` lets it: the gradient of tril) to what the neighbouring cells put there; the caller zeroes it */
static inline void write_channel(float *a, long channels, long c, struct shape d, long n0, v8 v, int masked) {
    if (!d.kernel) return store_cells(a, c, d.n, n0, v);
    long copy = stored(d, channels);
    scatter_add(a + (c % copy) * d.n, masked ? d.mask : 0, d, n0, c / copy - d.kernel / 2, v);
}

/* H0[u] = W_s s + b_in for the 8 cells at n0 */
static inline void shared_part(v8 *h0, const float *s, const float *w_in, const float *b_in, struct shape d,
                               long n0) {
    v8 ss[MAX_CHANNELS];
    for (long c = 0; c < d.c_s; c++) ss[c] = read_channel(s, d.c_s, c, d, n0, 1);
    long c_in = d.c_x + d.c_s;
    for (long u = 0; u < d.width; u++) h0[u] = weighted_sum((v8){0} + b_in[u], w_in + u * c_in + d.c_x, 1, ss, d.c_s);
}

/* The forward over groups [begin, end); inlined below with the channel counts as constants, so the compiler
   unrolls the loops over channels and keeps xs and ys in vector registers. */
static inline __attribute__((always_inline)) void forward_range(const float *x, const float *s, const float *w_in,
                                                                const float *b_in, const float *w_out, float *y,
                                                                float slope, struct shape d, long begin, long end) {
    const v8 zero = {0};
    const long c_in = d.c_x + d.c_s;
    v8 h0[MAX_WIDTH];
    for (long g = begin; g < end; g++) {
        long n0 = g * LANES;
        if (unread(d, n0)) {
            for (long b = 0; b < d.batch && !d.kernel; b++)
                for (long c = 0; c < d.c_out; c++) store_cells(y + b * d.c_out * d.n, c, d.n, n0, zero);
            continue;
        }
        shared_part(h0, s, w_in, b_in, d, n0);
        for (long b = 0; b < d.batch; b++) {
            v8 xs[MAX_CHANNELS], ys[MAX_CHANNELS];
            for (long c = 0; c < d.c_x; c++) xs[c] = read_channel(x + b * stored(d, d.c_x) * d.n, d.c_x, c, d, n0, 1);
            for (long c = 0; c < d.c_out; c++) ys[c] = zero;
            for (long u = 0; u < d.width; u++) {
                v8 h = weighted_sum(h0[u], w_in + u * c_in, 1, xs, d.c_x);
                h = where_positive(h > zero, h, h * slope);
                for (long c = 0; c < d.c_out; c++) ys[c] += w_out[c * d.width + u] * h;
            }
            for (long c = 0; c < d.c_out; c++)
                write_channel(y + b * stored(d, d.c_out) * d.n, d.c_out, c, d, n0, ys[c], 0);
        }
    }
}

/* The backward over groups [begin, end): dL/dx and dL/ds of their cells written; the per-lane sums of the
   weights' gradients added to sum_w_in (W * C_in), sum_b_in (W), sum_w_out (C_out * W). */
static inline __attribute__((always_inline)) void backward_range(
    const float *x, const float *s, const float *w_in, const float *b_in, const float *w_out, const float *grad_y,
    float *grad_x, float *grad_s, v8 *sum_w_in, v8 *sum_b_in, v8 *sum_w_out, float slope, struct shape d,
    long begin, long end) {
    const v8 zero = {0};
    const long c_in = d.c_x + d.c_s;
    v8 h0[MAX_WIDTH], grad_h0[MAX_WIDTH];
    v8 xs[CHUNK][MAX_CHANNELS], gys[CHUNK][MAX_CHANNELS], hs[MAX_WIDTH][CHUNK], ghs[MAX_WIDTH][CHUNK];
    for (long g = begin; g < end; g++) {
        long n0 = g * LANES;
        if (unread(d, n0)) {
            for (long b = 0; b < d.batch && !d.kernel; b++)
                for (long c = 0; c < d.c_x; c++) store_cells(grad_x + b * d.c_x * d.n, c, d.n, n0, zero);
            for (long c = 0; c < d.c_s && !d.kernel; c++) store_cells(grad_s, c, d.n, n0, zero);
            continue;
        }
        shared_part(h0, s, w_in, b_in, d, n0);
        for (long u = 0; u < d.width; u++) grad_h0[u] = zero;
        for (long b0 = 0; b0 < d.batch; b0 += CHUNK) {
            /* Pass 1, sequence by sequence: the hidden layer recomputed, its gradient, dL/dx; the hidden values
               and their gradients of CHUNK sequences kept for pass 2 (zero for a missing last few) */
            long chunk = d.batch - b0 < CHUNK ? d.batch - b0 : CHUNK;
            for (long k = 0; k < CHUNK; k++) {
                if (k < chunk) {
                    for (long c = 0; c < d.c_x; c++)
                        xs[k][c] = read_channel(x + (b0 + k) * stored(d, d.c_x) * d.n, d.c_x, c, d, n0, 1);
                    for (long c = 0; c < d.c_out; c++)
                        gys[k][c] = read_channel(grad_y + (b0 + k) * stored(d, d.c_out) * d.n, d.c_out, c, d, n0, 0);
                    continue;
                }
                for (long c = 0; c < d.c_x; c++) xs[k][c] = zero;
                for (long c = 0; c < d.c_out; c++) gys[k][c] = zero;
                for (long u = 0; u < d.width; u++) hs[u][k] = zero, ghs[u][k] = zero;
            }
            for (long k = 0; k < chunk; k++) {
                v8 gxs[MAX_CHANNELS];
                for (long c = 0; c < d.c_x; c++) gxs[c] = zero;
                for (long u = 0; u < d.width; u++) {
                    v8 h = weighted_sum(h0[u], w_in + u * c_in, 1, xs[k], d.c_x);  /* recomputed */
                    v8i positive = h > zero;
                    hs[u][k] = where_positive(positive, h, h * slope);
                    v8 gh = weighted_sum(zero, w_out + u, d.width, gys[k], d.c_out);
                    gh = where_positive(positive, gh, gh * slope);  /* through LeakyReLU */
                    ghs[u][k] = gh;
                    for (long c = 0; c < d.c_x; c++) gxs[c] += w_in[u * c_in + c] * gh;
                }
                for (long c = 0; c < d.c_x; c++)
                    write_channel(grad_x + (b0 + k) * stored(d, d.c_x) * d.n, d.c_x, c, d, n0, gxs[c], 1);
            }
            /* Pass 2: the weights' gradients, CHUNK sequences' products summed in registers before the running
               sum in memory is read and written (once per CHUNK sequences, not once per sequence) */
            for (long u = 0; u < d.width; u++) {
                grad_h0[u] += (ghs[u][0] + ghs[u][1]) + (ghs[u][2] + ghs[u][3]);
                for (long c = 0; c < d.c_out; c++)
                    sum_w_out[c * d.width + u] += (gys[0][c] * hs[u][0] + gys[1][c] * hs[u][1]) +
                                                  (gys[2][c] * hs[u][2] + gys[3][c] * hs[u][3]);
                for (long c = 0; c < d.c_x; c++)
                    sum_w_in[u * c_in + c] += (ghs[u][0] * xs[0][c] + ghs[u][1] * xs[1][c]) +
                                              (ghs[u][2] * xs[2][c] + ghs[u][3] * xs[3][c]);
            }
        }
        /* H0 = W_s s + b_in: its gradient, summed over the sequences, goes to W_s, s and b_in */
        v8 ss[MAX_CHANNELS], gss[MAX_CHANNELS];
        for (long c = 0; c < d.c_s; c++) ss[c] = read_channel(s, d.c_s, c, d, n0, 1), gss[c] = zero;
        for (long u = 0; u < d.width; u++) {
            sum_b_in[u] += grad_h0[u];
            for (long c = 0; c < d.c_s; c++) {
                sum_w_in[u * c_in + d.c_x + c] += grad_h0[u] * ss[c];
                gss[c] += w_in[u * c_in + d.c_x + c] * grad_h0[u];
            }
        }
        for (long c = 0; c < d.c_s; c++) write_channel(grad_s, d.c_s, c, d, n0, gss[c], 1);
    }
}

/* The shapes the built-in refiners meet most (DAPE's [S | B] over 4 and 8 heads, and [S, B] read from the data;
   the 1 x 3 conv over 4 heads) get their own unrolled copy; any other runs the general loops. */
#define SPECIALISED(CALL)                                                                                      \
    if (d.c_x == 4 && d.c_s == 4 && d.c_out == 4) { d.c_x = 4, d.c_s = 4, d.c_out = 4; CALL; }               \
    else if (d.c_x == 4 && d.c_s == 0 && d.c_out == 4) { d.c_x = 4, d.c_s = 0, d.c_out = 4; CALL; }          \
    else if (d.c_x == 8 && d.c_s == 0 && d.c_out == 4) { d.c_x = 8, d.c_s = 0, d.c_out = 4; CALL; }          \
    else if (d.c_x == 8 && d.c_s == 8 && d.c_out == 8) { d.c_x = 8, d.c_s = 8, d.c_out = 8; CALL; }          \
    else if (d.c_x == 12 && d.c_s == 12 && d.c_out == 12) { d.c_x = 12, d.c_s = 12, d.c_out = 12; CALL; }    \
    else if (d.c_x == 12 && d.c_s == 0 && d.c_out == 12) { d.c_x = 12, d.c_s = 0, d.c_out = 12; CALL; }      \
    else { CALL; }

void cell_mlp_forward(const float *x, const float *s, const float *w_in, const float *b_in, const float *w_out,
                      float *y, const unsigned char *mask, long keys, long reach, long kernel, long batch, long c_x,
                      long c_s, long c_out, long width, long n, float slope, long group_begin, long group_end) {
    struct shape d = {batch, c_x, c_s, c_out, width, n, mask, keys, reach, kernel};
    SPECIALISED(forward_range(x, s, w_in, b_in, w_out, y, slope, d, group_begin, group_end))
}

/* grad_w_in (W, C_in), grad_b_in (W) and grad_w_out (C_out, W) are this range's own (the caller sums the
   ranges'). Returns 0, or -1 if the buffer for the sums could not be allocated. */
int cell_mlp_backward(const float *x, const float *s, const float *w_in, const float *b_in, const float *w_out,
                      const float *grad_y, float *grad_x, float *grad_s, float *grad_w_in, float *grad_b_in,
                      float *grad_w_out, const unsigned char *mask, long keys, long reach, long kernel, long batch,
                      long c_x, long c_s, long c_out, long width, long n, float slope, long group_begin,
                      long group_end) {
    struct shape d = {batch, c_x, c_s, c_out, width, n, mask, keys, reach, kernel};
    long n_w_in = width * (c_x + c_s), n_w_out = c_out * width, sums = n_w_in + width + n_w_out;
    v8 *sum_w_in = aligned_alloc(sizeof(v8), (size_t)sums * sizeof(v8));
    if (!sum_w_in) return -1;
    v8 *sum_b_in = sum_w_in + n_w_in, *sum_w_out = sum_b_in + width;
    for (long i = 0; i < sums; i++) sum_w_in[i] = (v8){0};
    SPECIALISED(backward_range(x, s, w_in, b_in, w_out, grad_y, grad_x, grad_s, sum_w_in, sum_b_in, sum_w_out, slope,
                               d, group_begin, group_end))
    for (long i = 0; i < n_w_in; i++) grad_w_in[i] = lane_sum(sum_w_in[i]);
    for (long i = 0; i < width; i++) grad_b_in[i] = lane_sum(sum_b_in[i]);
    for (long i = 0; i < n_w_out; i++) grad_w_out[i] = lane_sum(sum_w_out[i]);
    free(sum_w_in);
    return 0;
}
