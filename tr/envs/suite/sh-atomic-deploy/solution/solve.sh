#!/usr/bin/env bash

cat > /app/deploy.sh <<'EOF'
#!/usr/bin/env bash
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: deploy.sh TARBALL" >&2; exit 2; }
tarball=$1
root=${DEPLOY_ROOT:-/app/srv}
name=$(basename "$tarball" .tar.gz)
mkdir -p "$root/releases"
exec 9>"$root/.deploy.lock"
flock -n 9 || { echo "deploy.sh: another deployment is running" >&2; exit 75; }
work=$(mktemp -d "$root/releases/.incoming.XXXXXX")
link="$root/.current.$$"
cleanup() { rm -rf -- "$work" "$link"; }
trap cleanup EXIT
fail() { echo "deploy.sh: $*" >&2; exit 1; }
[ -e "$root/releases/$name" ] && fail "release $name already exists"
tar -xzf "$tarball" -C "$work" || fail "cannot extract $tarball"
[ -x "$work/healthcheck.sh" ] || fail "no executable healthcheck.sh"
(cd "$work" && ./healthcheck.sh) || fail "health check failed"
mv -T -- "$work" "$root/releases/$name" || fail "cannot install release"
ln -s "releases/$name" "$link" && mv -T -- "$link" "$root/current" || fail "cannot switch current"
keep=$(ls -1 "$root/releases" | grep -v '^\.' | sort | tail -n 3)
current=$(basename "$(readlink "$root/current")")
for r in $(ls -1 "$root/releases" | grep -v '^\.'); do
    if ! grep -qxF -- "$r" <<<"$keep" && [ "$r" != "$current" ]; then rm -rf -- "$root/releases/$r"; fi
done
exit 0
EOF
chmod +x /app/deploy.sh

mkdir -p /tmp/rel && cd /tmp/rel && printf 'v1\n' > app.txt && printf '#!/bin/sh\ntest -f app.txt\n' > healthcheck.sh && chmod +x healthcheck.sh && tar -czf /tmp/r001.tar.gz app.txt healthcheck.sh && DEPLOY_ROOT=/tmp/droot /app/deploy.sh /tmp/r001.tar.gz && ls -la /tmp/droot /tmp/droot/releases && rm -rf /tmp/droot /tmp/rel /tmp/r001.tar.gz
