#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p geom/src geom/include
cd geom
cat > include/geom.h <<'EOF'
double circle_area(double r);
double circle_perimeter(double r);
EOF
cat > src/area.c <<'EOF'
#include <math.h>
#include "geom.h"

double circle_area(double r) { return M_PI * pow(r, 2); }
EOF
cat > src/perimeter.c <<'EOF'
#include <math.h>
#include "geom.h"

double circle_perimeter(double r) { return 2 * M_PI * r; }
EOF
cat > src/main.c <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include "geom.h"

int main(int argc, char **argv) {
    double r = argc > 1 ? atof(argv[1]) : 1.0;
    printf("area=%.3f perimeter=%.3f\n", circle_area(r), circle_perimeter(r));
    return 0;
}
EOF
cat > Makefile <<'EOF'
shapes: src/main.c src/area.c src/perimeter.c
	gcc -Iinclude -o shapes src/main.c src/area.c src/perimeter.c -lm
EOF
