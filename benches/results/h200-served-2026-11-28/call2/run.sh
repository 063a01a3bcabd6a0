#!/bin/bash
# Device call 2 (same machine, warm, right after call 1): long prompts under 32 streams with the
# step budget cut to 256 tokens ("b256") and with the defaults ("this"), in one run.
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 256\n' > /tmp/b/ds256; chmod +x /tmp/b/ds256
MODEL=/tmp/deltaserve-gdn-1.3b-v4096 timeout 90 bash benches/long_prompts.sh /tmp/b/serve_bench /tmp/l2 b256=/tmp/b/ds256 this=/tmp/b/deltaserve > /tmp/l2.log 2>&1
