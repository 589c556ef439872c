module github.com/dra-e2e/dra-e2e/spec-runner/ginkgo-json-check

go 1.26.0

require github.com/onsi/ginkgo/v2 v2.32.0

require github.com/Masterminds/semver/v3 v3.4.0 // indirect
