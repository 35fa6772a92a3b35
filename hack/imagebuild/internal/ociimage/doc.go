// Package ociimage assembles reproducible OCI images from static binaries,
// without a container engine: a shared base layer (CA roots from a pinned Go
// module, passwd, group, /data, /tmp) and one layer holding the binary, per
// platform, gathered into one image index per image. It writes them as an OCI
// image layout, as a tar of one (which containerd imports) or to a registry.
package ociimage
