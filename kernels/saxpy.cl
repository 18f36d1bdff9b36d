// saxpy with a bias: result[i] = a * x[i] + y[i] + BIAS.
//
// The OpenCL C twin of saxpy.comp: the same parameters in the same order (three buffers, then the
// scalars n and a, which a launch passes as the same 8 push-constant bytes), the same specialization
// constants under the same ids. kpc turns a spec constant into `-D NAME=value`; the declarations below
// say which id is which name and type (a value of another type is refused, as the SPIR-V twin refuses
// it), and the #ifndef blocks give the defaults.
//
// kpc-spec-constant 0 LOCAL_SIZE u32
// kpc-spec-constant 1 BIAS i32
#ifndef LOCAL_SIZE
#define LOCAL_SIZE 64
#endif
#ifndef BIAS
#define BIAS 0
#endif

__attribute__((reqd_work_group_size(LOCAL_SIZE, 1, 1)))
kernel void saxpy(global const float *x, global const float *y, global float *result, uint n, float a)
{
    uint i = get_global_id(0);
    if (i < n) {
        result[i] = a * x[i] + y[i] + (float)(BIAS);
    }
}
