# syntax=docker/dockerfile:1
#
# The headwater image, every Headwater service in one binary, built from
# the go.work workspace:
#
#   docker build -t headwater/headwater:dev \
#     --build-arg VERSION="$(git describe --tags --always --dirty)" \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)" .
#
#   docker run headwater/headwater:dev -target=fetcher [fetcher flags]
#
# -target is one of watcher, fetcher, packager, artifact-server, receiver,
# dispatcher, httpsource-fetcher (the HTTPSource plug-in kind's fetcher,
# deploy/components/httpsource) and setup (the install-time Job of
# deploy/base). VERSION,
# REVISION and BUILD_DATE (optional; .git is not sent to the build) are
# stamped into the binary, which reports them on -version, in its start-up
# log line and as headwater_build_info, and label the image. The binary is
# static (CGO_ENABLED=0) and runs as the "nonroot" user (65532) on an image
# without a shell or package manager. No service shells out: the fetcher
# clones with go-git, so the image needs no git binary.
#
# `make images` builds the same images without Docker (hack/imagebuild,
# reproducibly, for several platforms at once); this file stays for Docker
# users and holds the same things: the binary at /headwater, the base files
# hack/imagebuild writes (CA roots from the pinned golang.org/x/crypto/
# x509roots/fallback module, /etc/passwd and /etc/group naming nonroot,
# /data and /tmp owned by it), the same environment and labels.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src

# Module files first, so dependency downloads are cached across source edits.
# Every module of go.work must be present, even those not built here.
COPY go.work go.work.sum ./
COPY pkg/go.mod pkg/go.sum pkg/
COPY testsupport/go.mod testsupport/go.sum testsupport/
COPY services/watcher/go.mod services/watcher/go.sum services/watcher/
COPY services/fetcher/go.mod services/fetcher/go.sum services/fetcher/
COPY services/httpsource-fetcher/go.mod services/httpsource-fetcher/go.sum services/httpsource-fetcher/
COPY services/packager/go.mod services/packager/go.sum services/packager/
COPY services/artifact-server/go.mod services/artifact-server/go.sum services/artifact-server/
COPY services/receiver/go.mod services/receiver/go.sum services/receiver/
COPY services/dispatcher/go.mod services/dispatcher/go.sum services/dispatcher/
COPY services/setup/go.mod services/setup/go.sum services/setup/
COPY cmd/headwater/go.mod cmd/headwater/go.sum cmd/headwater/
COPY e2e/go.mod e2e/go.sum e2e/
COPY hack/imagebuild/go.mod hack/imagebuild/go.sum hack/imagebuild/
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download && \
    cd hack/imagebuild && GOWORK=off go mod download

COPY . .
ARG VERSION
ARG REVISION
ARG BUILD_DATE
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    cd cmd/headwater && \
    bi=github.com/headwater-gitops/headwater/pkg/buildinfo && \
    CGO_ENABLED=0 GOOS="${TARGETOS}" GOARCH="${TARGETARCH}" \
      go build -trimpath -buildvcs=false -o /out/headwater \
        -ldflags="-s -w -X $bi.Version=${VERSION} -X $bi.Revision=${REVISION} -X $bi.BuildDate=${BUILD_DATE}" .
# The base files of `make images`: CA roots, passwd, group, /data, /tmp.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    cd hack/imagebuild && GOWORK=off go run . -base-dir /out/base

FROM scratch
ARG VERSION
ARG REVISION
ARG BUILD_DATE
LABEL org.opencontainers.image.title="headwater" \
      org.opencontainers.image.description="Headwater, every service in one image (-target picks one): a horizontally scalable Flux source-controller" \
      org.opencontainers.image.source="https://github.com/headwater-gitops/headwater" \
      org.opencontainers.image.url="https://github.com/headwater-gitops/headwater" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${BUILD_DATE}"
COPY --from=build /out/base/etc /etc
# /data is where the dir storage backend lives. Created owned by the runtime
# user, so a fresh named volume mounted there (docker compose) is writable.
COPY --from=build --chown=65532:65532 /out/base/data /data
COPY --from=build --chown=65532:65532 /out/base/tmp /tmp
COPY --from=build --chown=65532:65532 /out/base/home/nonroot /home/nonroot
COPY --from=build /out/headwater /headwater
ENV PATH=/usr/local/bin:/usr/bin:/bin \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
WORKDIR /
USER 65532:65532
ENTRYPOINT ["/headwater"]
