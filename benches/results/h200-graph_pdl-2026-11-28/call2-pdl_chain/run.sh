set -x
cd .devbuild/graphnodes
nvcc -arch=sm_90a -O3 -o pdl pdl.cu && ./pdl 2>&1 | tee $OUT/pdl.log
cd ../../kernels/cuda
for f in gemv gemv_staged; do
  nvcc -arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -cubin -o /tmp/$f.cubin $f.cu && cuobjdump -sass /tmp/$f.cubin > $OUT/$f.sass
done
ls -la $OUT
