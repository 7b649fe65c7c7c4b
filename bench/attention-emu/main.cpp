// CPU check of the CUDA attention templates (compiler/src/back/cuda/attention.rs, LIB): each
// kernel runs as C++ with one thread per CUDA thread of a block (emu.h: barriers, shuffles,
// static shared memory), on random inputs, against an f64 evaluation of the formulas of
// Op::AttnLse / Attention / AttentionGrad. Outputs start as NaN, so an unwritten element fails.
// Batch 0 of a masked case has every key masked (lse 0, outputs and gradients 0). Run: ./run.sh
#include "emu.h"
#include "lib.h"
using namespace std;
typedef vector<float2> C;
struct Cx { double x, y; };
static int g_failures = 0;
template <int B, int H, int T, int S, int D, int DV, int ABS, int CAUSAL, int MASK, int DROP, int RM, int RN, int RMK, int RNK, int RC>
void run(const char* name, unsigned seed) {
  mt19937 rng(seed); normal_distribution<float> nd;
  const int BH = B * H;
  C q(BH * T * D), k(BH * S * D), v(BH * S * DV), dO(BH * T * DV);
  for (auto* a : {&q, &k, &v, &dO}) for (auto& z : *a) z = make_float2(nd(rng), nd(rng));
  vector<float> mask(B * S);
  for (auto& m : mask) m = nd(rng) > 0.0f ? 1.0f : 0.0f;
  if (MASK) for (int j = 0; j < S; ++j) mask[j] = 1.0f;  // batch 0: every key masked
  const float scale = 1.0f / sqrtf((float)D);
  const double p_drop = 0.3; const u32 salt = 7, step = 3;
  const u32 thr = (u32)((1.0 - p_drop) * 16777216.0); const float keep = (float)(1.0 / (1.0 - p_drop));
  vector<float> lse(BH * T, -999.f); C o(BH * T * DV, make_float2(NAN, NAN)), dq(BH * T * D, make_float2(NAN, NAN)), dkv(BH * S * (D + DV), make_float2(NAN, NAN));
  launch(BH * ((T + 16 * RM - 1) / (16 * RM)), [&] { attn_lse<H, T, S, D, ABS, CAUSAL, MASK, 0, RM, RN>(q.data(), k.data(), mask.data(), lse.data(), scale, 0, 1.0f, 0, 0); });
  launch(BH * ((T + 16 * RM - 1) / (16 * RM)), [&] { attn_fwd<H, T, S, D, DV, ABS, CAUSAL, MASK, DROP, RM, RN>(q.data(), k.data(), v.data(), lse.data(), mask.data(), o.data(), scale, thr, keep, salt, step); });
  launch(BH * ((T + 16 * RM - 1) / (16 * RM)), [&] { attn_dq<H, T, S, D, DV, ABS, CAUSAL, MASK, DROP, RM, RN>(q.data(), k.data(), v.data(), o.data(), dO.data(), lse.data(), mask.data(), dq.data(), scale, thr, keep, salt, step); });
  launch(BH * ((S + 16 * RNK - 1) / (16 * RNK)), [&] { attn_dkv<H, T, S, D, DV, ABS, CAUSAL, MASK, DROP, RMK, RNK, RC>(q.data(), k.data(), v.data(), o.data(), dO.data(), lse.data(), mask.data(), dkv.data(), scale, thr, keep, salt, step); });
  // f64 reference from the contract.
  double e_lse = 0, n_lse = 0, e_o = 0, n_o = 0, e_dq = 0, n_dq = 0, e_dk = 0, n_dk = 0, e_dv = 0, n_dv = 0;
  vector<Cx> rdk(BH * S * D, {0, 0}), rdv(BH * S * DV, {0, 0});
  for (int bh = 0; bh < BH; ++bh) {
    int b = bh / H;
    for (int i = 0; i < T; ++i) {
      vector<double> s(S), cr(S), ci(S); vector<bool> ok(S);
      double mx = -1e300;
      for (int j = 0; j < S; ++j) {
        double a = 0, c = 0;
        for (int d = 0; d < D; ++d) { float2 x = q[(bh * T + i) * D + d], y = k[(bh * S + j) * D + d]; a += (double)x.x * y.x + (double)x.y * y.y; c += (double)x.y * y.x - (double)x.x * y.y; }
        cr[j] = a; ci[j] = c;
        s[j] = ABS ? scale * sqrt(a * a + c * c) : scale * a;
        ok[j] = !(CAUSAL && j > i) && !(MASK && mask[b * S + j] != 0.0f);
        if (ok[j]) mx = max(mx, s[j]);
      }
      double l = 0; for (int j = 0; j < S; ++j) if (ok[j]) l += exp(s[j] - mx);
      double L = l > 0 ? mx + log(l) : 0.0;
      e_lse += pow(L - lse[bh * T + i], 2); n_lse += L * L;
      vector<double> p(S), kp(S);
      for (int j = 0; j < S; ++j) {
        p[j] = ok[j] ? exp(s[j] - L) : 0.0;
        kp[j] = DROP ? ((dropout_hash(salt, step, (u32)(((u64)bh * T + i) * S + j)) >> 8) < thr ? keep : 0.0) : 1.0;
      }
      vector<Cx> ro(DV, {0, 0});
      for (int j = 0; j < S; ++j) for (int e = 0; e < DV; ++e) { float2 w = v[(bh * S + j) * DV + e]; ro[e].x += kp[j] * p[j] * w.x; ro[e].y += kp[j] * p[j] * w.y; }
      double delta = 0;
      for (int e = 0; e < DV; ++e) {
        float2 got = o[(bh * T + i) * DV + e]; e_o += pow(got.x - ro[e].x, 2) + pow(got.y - ro[e].y, 2); n_o += ro[e].x * ro[e].x + ro[e].y * ro[e].y;
        float2 g = dO[(bh * T + i) * DV + e]; delta += g.x * ro[e].x + g.y * ro[e].y;
      }
      vector<Cx> rq(D, {0, 0});
      for (int j = 0; j < S; ++j) {
        double dpt = 0; for (int e = 0; e < DV; ++e) { float2 g = dO[(bh * T + i) * DV + e], w = v[(bh * S + j) * DV + e]; dpt += (double)g.x * w.x + (double)g.y * w.y; }
        double ds = p[j] * (kp[j] * dpt - delta);
        Cx gg;
        if (!ABS) gg = {scale * ds, 0};
        else { double mag = sqrt(cr[j] * cr[j] + ci[j] * ci[j]); gg = mag > 0 ? Cx{scale * ds * cr[j] / mag, scale * ds * ci[j] / mag} : Cx{0, 0}; }
        for (int d = 0; d < D; ++d) {
          float2 kk = k[(bh * S + j) * D + d], qq = q[(bh * T + i) * D + d];
          rq[d].x += gg.x * kk.x - gg.y * kk.y; rq[d].y += gg.x * kk.y + gg.y * kk.x;
          // conj(g) q
          rdk[(bh * S + j) * D + d].x += gg.x * qq.x + gg.y * qq.y; rdk[(bh * S + j) * D + d].y += gg.x * qq.y - gg.y * qq.x;
        }
        for (int e = 0; e < DV; ++e) { float2 g = dO[(bh * T + i) * DV + e]; rdv[(bh * S + j) * DV + e].x += kp[j] * p[j] * g.x; rdv[(bh * S + j) * DV + e].y += kp[j] * p[j] * g.y; }
      }
      for (int d = 0; d < D; ++d) { float2 got = dq[(bh * T + i) * D + d]; e_dq += pow(got.x - rq[d].x, 2) + pow(got.y - rq[d].y, 2); n_dq += rq[d].x * rq[d].x + rq[d].y * rq[d].y; }
    }
  }
  for (int bh = 0; bh < BH; ++bh) for (int j = 0; j < S; ++j) {
    for (int d = 0; d < D; ++d) { float2 got = dkv[(bh * S + j) * (D + DV) + d]; Cx r = rdk[(bh * S + j) * D + d]; e_dk += pow(got.x - r.x, 2) + pow(got.y - r.y, 2); n_dk += r.x * r.x + r.y * r.y; }
    for (int e = 0; e < DV; ++e) { float2 got = dkv[(bh * S + j) * (D + DV) + D + e]; Cx r = rdv[(bh * S + j) * DV + e]; e_dv += pow(got.x - r.x, 2) + pow(got.y - r.y, 2); n_dv += r.x * r.x + r.y * r.y; }
  }
  auto rel = [](double e, double n) { return sqrt(e / max(n, 1e-300)); };
  double worst = max({rel(e_lse, n_lse), rel(e_o, n_o), rel(e_dq, n_dq), rel(e_dk, n_dk), rel(e_dv, n_dv)});
  printf("%-40s lse %.1e o %.1e dq %.1e dk %.1e dv %.1e %s\n", name, rel(e_lse, n_lse), rel(e_o, n_o), rel(e_dq, n_dq), rel(e_dk, n_dk), rel(e_dv, n_dv), (worst < 1e-5 && worst == worst) ? "ok" : "FAIL");
  if (!(worst < 1e-5)) ++g_failures;
}
int main() {
  //   B  H  T   S    D    DV  ABS C  M  DR RM RN RMK RNK RC   (tiles as attention.rs picks them, and smaller)
  run<2, 2, 70, 45, 16, 16, 0, 0, 0, 0, 4, 4, 4, 2, 16>("real 70x45 d16", 1);
  run<2, 1, 70, 100, 64, 64, 0, 1, 1, 1, 4, 4, 4, 2, 16>("real causal mask dropout 70x100 d64", 2);
  run<2, 1, 130, 70, 40, 24, 1, 0, 0, 1, 4, 4, 4, 2, 16>("abs dropout 130x70 d40/24", 3);
  run<2, 1, 30, 40, 100, 128, 1, 1, 1, 0, 4, 2, 4, 2, 8>("abs causal mask 30x40 d100/128", 4);
  run<1, 1, 45, 37, 8, 72, 0, 1, 0, 0, 4, 2, 4, 2, 8>("real causal 45x37 d8/72", 5);
  run<2, 1, 50, 70, 40, 24, 1, 0, 0, 1, 2, 1, 2, 1, 4>("abs dropout small tiles", 6);
  run<3, 1, 20, 17, 24, 40, 1, 0, 1, 1, 1, 1, 1, 1, 4>("abs mask dropout 16x16 tiles", 7);
  return g_failures ? 1 : 0;
}
