# The Berth image: the operator (`berth controller`) and the agent that the
# init container of every workspace pod copies from it (`berth install`). One static binary,
# built without the simulator, on a distroless base: no shell, no package manager, non-root.
#
#   docker build -t ghcr.io/berth-dev/berth:0.1.0 .
#
# The binary must be static: it runs inside workspace images of any distribution (musl or
# glibc), so it is built for the musl target.

FROM rust:1-bookworm AS build
ARG TARGET=x86_64-unknown-linux-musl
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add "$TARGET"
WORKDIR /src
COPY . .
# The build line `.ci/run` runs too (without --target), so it cannot rot.
# The `dist` profile (Cargo.toml): release, optimised across crates in one codegen unit.
RUN cargo build --profile dist --locked -p berth --no-default-features --target "$TARGET" \
    && cp "target/$TARGET/dist/berth" /berth

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /berth /usr/local/bin/berth
# 65532:65532, the distroless nonroot user; the root filesystem may be read-only.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/berth"]
CMD ["controller"]
