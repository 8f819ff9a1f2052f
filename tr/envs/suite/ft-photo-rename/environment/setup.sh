#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p photos/archive
i=0
for name in "IMG 0001.JPG" "img_0002.jpeg" "Img-0003.Jpg" "IMG_0004.JPEG" "holiday 0005.jpg" "DSC-0017.JPG" "scan 0042.jPeG"; do
  n=$(printf '%s' "$name" | grep -o '[0-9]\{4\}')
  printf 'JPEGDATA-%s\n' "$n" > "photos/$name"
done
printf 'remember to back up\n' > photos/notes.txt
printf 'not a picture\n' > "photos/IMG_0006.txt"
printf 'raw data\n' > "photos/IMG 0007.png"
printf 'JPEGDATA-0099\n' > "photos/archive/IMG_0099.JPG"
