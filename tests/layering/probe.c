/* A source compiled as part of one layer that includes one header
 * (KVR_PROBE_HEADER); tests/layering/CMakeLists.txt says which must build
 * and which must fail with "file not found". */
#include KVR_PROBE_HEADER

int kvr__layering_probe(void);
int kvr__layering_probe(void)
{
    return 0;
}
