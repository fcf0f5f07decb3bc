#ifndef FAKE_FP16_H
#define FAKE_FP16_H
#include <stdint.h>
#include <math.h>
struct __half { uint16_t x; };
inline float __half2float(__half h) {
    int s = h.x >> 15, e = (h.x >> 10) & 31, m = h.x & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
    return s ? -v : v;
}
#endif
