// The same-shape maps of eltwise.comp as one function, shared with fused.comp so that a fused
// chain computes each element with exactly the expressions of the unfused launches.
// Map m (eltwise.comp's MODE): 1 scale x*f, 2 silu, 3 silu_back (x, dy = b), 4 swiglu (g = x, u = b),
// 5 swiglu_back d/dgate (g, u = b, dy = c), 6 swiglu_back d/dup (g, -, dy = c),
// 7 gelu (tanh approximation: x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)), 8 gelu_back (x, dy = b),
// 9 tanh (|x| clamped at 15, where tanh is 1 in float), 10 tanh_back (x, dy = b).

float sigm(float x) { return 1.0 / (1.0 + exp(-x)); }
float gelu_2u(float x) { return 1.5957691216057308 * (x + 0.044715 * x * x * x); }

// whether map m reads its second (b) / third (c) operand
bool ew_reads_b(int m) { return m == 3 || m == 4 || m == 5 || m == 8 || m == 10; }
bool ew_reads_c(int m) { return m == 5 || m == 6; }

float ew_map(int m, float x, float b, float c, float f) {
    float r;
    if (m == 1) r = x * f;
    else if (m == 2) r = x * sigm(x);
    else if (m == 3) { float s = sigm(x); r = b * s * (1.0 + x * (1.0 - s)); }
    else if (m == 4) r = x * sigm(x) * b;
    else if (m == 5) { float s = sigm(x); r = c * b * s * (1.0 + x * (1.0 - s)); }
    else if (m == 6) r = c * x * sigm(x);
    else if (m == 7) r = x * sigm(gelu_2u(x));
    else if (m == 9) r = tanh(clamp(x, -15.0, 15.0));
    else if (m == 10) { float t = tanh(clamp(x, -15.0, 15.0)); r = b * (1.0 - t * t); }
    else { float s = sigm(gelu_2u(x)); r = b * (s + x * s * (1.0 - s) * 1.5957691216057308 * (1.0 + 0.134145 * x * x)); }
    return r;
}
