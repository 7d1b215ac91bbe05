#!/usr/bin/env bash
# Makes .gpu/ at the project root (git-ignored): what the GPU suite needs that the GPU machine lacks.
#   .gpu/.whl/   wheels of the torch-side packages: segment-anything (the SAM reference), hydra-core, omegaconf,
#                antlr4-python3-runtime, iopath, portalocker (the official SAM 2 code), easydict (isegm);
#                sdists are built into wheels here (pip wheel); all are pure Python
#   .gpu/ref/    the Python code (no weights) of the reference checkouts named by $JAXSEG_SAM2_REPO
#                (facebookresearch/sam2), $JAXSEG_RITM_REPO (SamsungLabs/ritm_interactive_segmentation) and
#                $JAXSEG_SIMPLECLICK_REPO (uncbiag/SimpleClick); a missing one is said, and its step fails
#   .gpu/real/   8 DAVIS + 8 Berkeley images with masks from $JAXSEG_REAL_DATA (default ../shared/data/real)
# Then, on a lent GPU with the device tool:
#   command: OUT="$OUT" bash experiments/gpu_suite/run.sh     carry: [".gpu"]     timeout_s: 540
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dst="$root/.gpu"
PY="${PY:-python3}"
real="${JAXSEG_REAL_DATA:-$root/../shared/data/real}"
rm -rf "$dst"; mkdir -p "$dst/.whl" "$dst/ref" "$dst/real"

"$PY" -m pip wheel -q --no-deps -w "$dst/.whl" segment-anything==1.0 hydra-core==1.3.2 omegaconf==2.3.0 \
    antlr4-python3-runtime==4.9.3 iopath==0.1.10 portalocker easydict 2>&1 | grep -v "^WARNING: Location" || true
ls "$dst/.whl"

copy_code() {  # copy_code NAME CHECKOUT PACKAGE: the package's .py / .yaml files (and a root config.yml)
  local name="$1" src="$2" package="$3"
  if [ -z "$src" ] || [ ! -d "$src/$package" ]; then
    echo "no $name checkout (got '${src}'): its step will fail; set the variable to a checkout"
    return
  fi
  mkdir -p "$dst/ref/$name"
  (cd "$src" && find "$package" -type f \( -name '*.py' -o -name '*.yaml' \) -print0 \
      | tar --null -cf - -T - $( [ -f config.yml ] && echo config.yml )) | tar -C "$dst/ref/$name" -xf -
  echo "$name: $(find "$dst/ref/$name" -type f | wc -l) files from $src"
}
copy_code sam2 "${JAXSEG_SAM2_REPO:-}" sam2
copy_code ritm "${JAXSEG_RITM_REPO:-}" isegm
copy_code simpleclick "${JAXSEG_SIMPLECLICK_REPO:-}" isegm

for ds in davis berkeley; do
  src="$real/$ds"
  mkdir -p "$dst/real/$ds/images" "$dst/real/$ds/masks"
  head -1 "$src/index.csv" > "$dst/real/$ds/index.csv"
  sed -n '2,9p' "$src/index.csv" | while IFS= read -r line; do   # rows 1-8 (head would end tail with SIGPIPE)
    img=${line%%,*}; rest=${line#*,}; msk=${rest%%,*}
    cp "$src/$img" "$dst/real/$ds/$img"; cp "$src/$msk" "$dst/real/$ds/$msk"
    echo "$line" >> "$dst/real/$ds/index.csv"
  done
done
du -sh "$dst"
echo "device run: command 'OUT=\"\$OUT\" bash experiments/gpu_suite/run.sh', carry ['.gpu'], timeout_s 540"
