// Closes cpu/isa_target.h at the end of a per-level translation unit (Clang's attribute push
// must be popped; GCC's target pragma simply ends with the file).
#if KVFLASH_CPU_AVX2 && defined(__clang__)
#pragma clang attribute pop
#endif
