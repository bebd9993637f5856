/* `kvpred --version`: the version, and what a bug report needs: the kernels this run uses and
 * the ones the CPU also runs, and OpenBLAS's. */
#include <stdio.h>

#include <cblas.h> /* OpenBLAS's: openblas_get_corename */

#include "cli/cli.h"
#include "kernels/simd.h"
#include "kvpred.h"

int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("kvpred %s\nsimd: %s in use; this CPU runs", KVP_VERSION, kvp_simd()->name);
    const struct kvp_simd_ops *t[8];
    for (int i = 0, n = kvp_simd_runnable(t, 8); i < n; i++)
        printf(" %s", t[i]->name);
    printf(" (KVP_SIMD chooses)\nblas: OpenBLAS, %s kernels (OPENBLAS_CORETYPE chooses)\n",
           openblas_get_corename());
    return 0;
}
