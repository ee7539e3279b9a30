# Pagoda's OpenAI-compatible server in a container, installed from the Debian package that
# `make deb` builds and ctest's install_test checks (docs/deployment.md, "Docker").
#
#   docker build -t pagoda .
#   docker run --rm -p 8000:8000 -v /srv/models:/models:ro pagoda /models/model.gguf --max-model-len 8192
#   docker stop -t 90 CONTAINER    # SIGTERM drains; give it more than --shutdown-timeout

# Build: the same setup script and make target as on a developer's machine, without the tests.
FROM debian:12 AS build
WORKDIR /src
COPY . .
RUN scripts/setup && make deb CMAKE_FLAGS=-DPAGODA_BUILD_TESTS=OFF

# Run: Debian with the package installed by apt, which brings its run-time dependencies and
# makes the pagoda user (the package's postinst).
FROM debian:12-slim
COPY --from=build /src/build/release/packages/ /tmp/packages/
RUN apt-get update \
 && apt-get install -y --no-install-recommends /tmp/packages/pagoda_*.deb curl ca-certificates \
 && rm -rf /var/lib/apt/lists/* /tmp/packages
USER pagoda
WORKDIR /var/lib/pagoda
EXPOSE 8000
# /health is 503 while the model loads (the start period) and when the engine has failed or stalled.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10m --retries=3 \
  CMD curl -fsS -o /dev/null http://127.0.0.1:8000/health || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/pagoda", "serve", "--host", "0.0.0.0", "--port", "8000"]
# The model and any other flags of `pagoda serve`; demo-random (random weights) only shows it runs.
CMD ["demo-random"]
