#!/bin/sh
# Make a local Debian 12 base image from Debian's packages, for machines that cannot pull from
# a public registry:  debootstrap --variant=minbase bookworm -> podman import.
# The image carries this host's extra CA certificates (/usr/local/share/ca-certificates) and
# its /etc/pip.conf, so pip and Maven inside builds work through the same HTTPS egress as the
# host.  A second run finds the image and does nothing.
#   usage: make-base-image.sh [IMAGE]      (default localhost/bookworm-min:latest)
set -eu
IMAGE=${1:-localhost/bookworm-min:latest}
if podman image exists "$IMAGE"; then
    echo "base image $IMAGE: present (cached)"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing (apt-get install -y debootstrap)" >&2; exit 1; }
ROOTFS=$(mktemp -d /tmp/bookworm-min.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
start=$(date +%s)
debootstrap --variant=minbase --include=ca-certificates bookworm "$ROOTFS" \
    "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$ROOTFS.log" 2>&1 \
    || { tail -20 "$ROOTFS.log" >&2; exit 1; }
rm -f "$ROOTFS.log"
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
    chroot "$ROOTFS" update-ca-certificates >/dev/null
fi
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$ROOTFS/etc/pip.conf"
# Keep the image small: no package lists, no docs.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin \
    "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*
tar -C "$ROOTFS" -c . | podman import --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
echo "base image $IMAGE: made in $(( $(date +%s) - start ))s"
