module github.com/dra-e2e/dra-e2e/xtask/local-cluster/images

go 1.26.0
