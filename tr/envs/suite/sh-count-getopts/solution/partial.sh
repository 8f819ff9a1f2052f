#!/usr/bin/env bash

printf '#!/bin/bash\ntotal=0\npat=$1\nshift\nfor f in "$@"; do n=$(grep -cF -e "$pat" "$f"); echo "$f: $n"; total=$((total+n)); done\necho "total: $total"\n' > /app/count.sh && chmod +x /app/count.sh
