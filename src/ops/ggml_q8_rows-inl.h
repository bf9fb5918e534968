// The row-range drivers the int8-activation kernels share (see ggml_q8.h): the loops that walk
// rows and tokens around each ISA's register kernels. Per-target code with no include guard:
// included inside the kernel namespace of each ISA, so that it is compiled with that target's
// flags -- ggml_q8.cpp's AVX-512 q8k (decode only), ggml_q8_avx2-inl.h's q8avx2 and
// ggml_q8_neon-inl.h's neon_base / neon_dot -- after that namespace's constants kRows,
// kPrefetchBytes, kTokenTile, kSegBlocks and kPanelTok.
//
// K, the ISA's kernels, provides
//   template <GgmlType Q, int R> static void Gemv(const uint8_t* row, int64_t rb, const Q8Acts& a, float* y,
//                                                 const uint8_t* prefetch)
//     decode: y[i] = row (row + i * rb, i < R, rb bytes per row) . the one token of a; when
//     prefetch is not null, the same rows at `prefetch` are prefetched;
//   template <int R, int TT> static void Tile(const q8::PanelBlock* panel, int64_t nb, const Q8Acts& a,
//                                             int64_t b0, int64_t t, float* acc)
//     prefill register tile: R panel rows (nb blocks each, from block b0) x TT tokens from token t,
//     acc [TT][R][16] += the dots per 16-column group;
//   static float Sum16(const float* o)
//     the sum of the 16 floats at o (64-byte aligned), in the ISA's fixed order.
// Each driver runs the same loops, in the same order, as the ISA's own code did: the results are
// those bits.

#define SPOOL_Q8_ROWS_INLINE inline __attribute__((always_inline))

// Decode (a.T == 1): rows [r0, r1) into y[r0 .. r1), kRows at a time, then one at a time; each
// group prefetches the group `ahead` rows on (rows [r0, r0 + ahead) are read before any prefetch
// reaches them: at most a quarter of a short range, so the small chunks of a 2048 x 512 matrix
// keep most of theirs).
template <class K, GgmlType Q>
SPOOL_Q8_ROWS_INLINE void DecodeRowRange(const GgmlView& w, const Q8Acts& a, float* y, int64_t r0, int64_t r1) {
  const int64_t rb = w.row_bytes();
  const int64_t ahead = kRows * std::max<int64_t>(1, std::min(kPrefetchBytes / (kRows * rb), (r1 - r0) / (4 * kRows)));
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows)
    K::template Gemv<Q, kRows>(w.data + r * rb, rb, a, y + r, r + ahead + kRows <= r1 ? w.data + (r + ahead) * rb : nullptr);
  for (; r < r1; ++r) K::template Gemv<Q, 1>(w.data + r * rb, rb, a, y + r, nullptr);
}

// Prefill: rows [r, r + R) against tokens [t0, t1) into y[t * ldy + row]; per segment of
// kSegBlocks blocks the rows are decoded into `panel` ([R][kSegBlocks]) once, then the tokens run
// kPanelTok at a time, then one at a time, into `acc` ([t1 - t0][R][16], 64-byte aligned).
template <class K, int R>
SPOOL_Q8_ROWS_INLINE void PanelRowGroup(const GgmlView& w, int64_t r, int64_t t0, int64_t t1, const Q8Acts& a, float* y,
                                        int64_t ldy, q8::PanelBlock* __restrict panel, float* __restrict acc) {
  const int64_t rb = w.row_bytes(), nt = t1 - t0, bytes = ggml_type_traits(w.type).size;
  std::fill(acc, acc + nt * R * 16, 0.0f);
  for (int64_t b0 = 0; b0 < a.blocks(); b0 += kSegBlocks) {
    const int64_t nb = std::min(kSegBlocks, a.blocks() - b0);
    for (int i = 0; i < R; ++i)
      for (int64_t b = 0; b < nb; ++b)
        q8::decode_panel_block(w.type, w.data + (r + i) * rb + (b0 + b) * bytes, panel[i * kSegBlocks + b]);
    int64_t t = 0;
    for (; t + kPanelTok <= nt; t += kPanelTok) K::template Tile<R, kPanelTok>(panel, nb, a, b0, t0 + t, acc + t * R * 16);
    for (; t < nt; ++t) K::template Tile<R, 1>(panel, nb, a, b0, t0 + t, acc + t * R * 16);
  }
  for (int64_t t = 0; t < nt; ++t)
    for (int i = 0; i < R; ++i) y[(t0 + t) * ldy + r + i] = K::Sum16(acc + (t * R + i) * 16);
}

// Prefill (a.T >= 2): rows [r0, r1) x all tokens, kTokenTile tokens per pass over the rows, the
// rows RP at a time (PanelRowGroup), then one at a time.
template <class K, int RP>
SPOOL_Q8_ROWS_INLINE void PrefillRowRange(const GgmlView& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  alignas(64) q8::PanelBlock panel[RP * kSegBlocks];
  alignas(64) float acc[kTokenTile * RP * 16];
  for (int64_t t0 = 0; t0 < a.T; t0 += kTokenTile) {
    const int64_t t1 = std::min(a.T, t0 + kTokenTile);
    int64_t r = r0;
    for (; r + RP <= r1; r += RP) PanelRowGroup<K, RP>(w, r, t0, t1, a, y, ldy, panel, acc);
    for (; r < r1; ++r) PanelRowGroup<K, 1>(w, r, t0, t1, a, y, ldy, panel, acc);
  }
}

#undef SPOOL_Q8_ROWS_INLINE
