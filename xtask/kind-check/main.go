// Command kind-check loads a kind cluster configuration with kind's own code and prints a JSON
// summary of it (nodes and roles, feature gates, runtime config, containerd and kubeadm patches).
//
// Usage: kind-check [--name CLUSTER] FILE
//
// It exits non-zero, printing kind's error, when kind would reject the file.
//
// How the file is checked, and why this way:
//
//   - kind's loader (`encoding.Load` / `encoding.Parse`: apiVersion and kind dispatch, a strict
//     YAML decode that rejects unknown fields, defaulting and conversion) lives in
//     sigs.k8s.io/kind/pkg/internal/..., which other modules cannot import. The public way into it
//     is the one `kind create cluster --config FILE` takes: `(*cluster.Provider).Create` with the
//     `cluster.CreateWithRawConfig` option. Create applies its options in order and returns the
//     first option's error before it touches the node provider, so kind-check passes the raw file
//     followed by a config *file* option that names a path which cannot exist (inside a fresh
//     temporary directory). If kind's loader rejects the file, Create returns kind's error; if it
//     accepts it, Create stops at the second option with a "not exist" error, which is the
//     success signal. PATH is also emptied first, so even a future kind that changed the order
//     could not find a container runtime to start anything.
//   - The summary is decoded from the same bytes with kind's public v1alpha4 types and the same
//     YAML library and strictness kind uses (go.yaml.in/yaml/v3 with KnownFields), then defaulted
//     with v1alpha4.SetDefaultsCluster, as kind's V1Alpha4ToInternal does.
//   - kind's `Validate` is internal and runs only after the provider has listed existing nodes,
//     so kind-check repeats its node checks (valid roles, at least one control-plane node, a
//     valid cluster name) itself.
//   - containerdConfigPatches are parsed with github.com/pelletier/go-toml, the library kind uses
//     to merge them into the node's containerd config; a patch that sets `version` is reported,
//     because kind skips patches whose version differs from the node's config.
//   - kubeadmConfigPatches are decoded as YAML and reported with their kind and apiVersion.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"

	toml "github.com/pelletier/go-toml"
	yaml "go.yaml.in/yaml/v3"
	"sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
	"sigs.k8s.io/kind/pkg/cluster"
)

// Summary is the JSON printed on success.
type Summary struct {
	// Name is the cluster name the check used (kind's --name overrides the file's name).
	Name string `json:"name"`
	// Nodes lists the nodes in file order.
	Nodes []NodeSummary `json:"nodes"`
	// Roles counts nodes per role.
	Roles map[string]int `json:"roles"`
	// FeatureGates is the top-level featureGates map.
	FeatureGates map[string]bool `json:"featureGates"`
	// RuntimeConfig is the top-level runtimeConfig map.
	RuntimeConfig map[string]string `json:"runtimeConfig"`
	// ContainerdConfigPatches holds each containerd patch as kind parses it.
	ContainerdConfigPatches []ContainerdPatch `json:"containerdConfigPatches"`
	// KubeadmConfigPatches holds each cluster-wide kubeadm patch, decoded.
	KubeadmConfigPatches []KubeadmPatch `json:"kubeadmConfigPatches"`
}

// NodeSummary describes one node.
type NodeSummary struct {
	Role  string `json:"role"`
	Image string `json:"image"`
}

// ContainerdPatch is one containerd config patch.
type ContainerdPatch struct {
	// Raw is the patch text.
	Raw string `json:"raw"`
	// Parsed is the patch as a tree, parsed by the TOML library kind merges patches with.
	Parsed map[string]interface{} `json:"parsed"`
	// Version is the patch's `version` (0 when unset, meaning "applies to any config version").
	Version int64 `json:"version"`
}

// KubeadmPatch is one kubeadm config patch.
type KubeadmPatch struct {
	Kind       string                 `json:"kind"`
	APIVersion string                 `json:"apiVersion"`
	Parsed     map[string]interface{} `json:"parsed"`
}

// kind's own rule for cluster names (pkg/internal/apis/config/validate.go).
var validNameRE = regexp.MustCompile(`^[a-z0-9.-]+$`)

func main() {
	name := flag.String("name", "dra-e2e", "cluster name to check the file with (as `kind create cluster --name`)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: kind-check [--name CLUSTER] FILE\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	summary, err := check(flag.Arg(0), *name)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kind-check: %s: %v\n", flag.Arg(0), err)
		os.Exit(1)
	}
	out, err := json.MarshalIndent(summary, "", "  ")
	if err != nil {
		fmt.Fprintf(os.Stderr, "kind-check: encoding the summary: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}

func check(path, name string) (*Summary, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := loadWithKind(raw, name); err != nil {
		return nil, err
	}
	cfg, err := decodeV1Alpha4(raw)
	if err != nil {
		return nil, err
	}
	if name != "" {
		cfg.Name = name // as kind create cluster --name does
	}
	return summarize(cfg)
}

// loadWithKind runs kind's own loader through the public Provider.Create path (see the package
// comment) and returns kind's error if it rejects raw.
func loadWithKind(raw []byte, name string) error {
	dir, err := os.MkdirTemp("", "kind-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	stop := filepath.Join(dir, "stop-here-this-file-does-not-exist.yaml")

	// Nothing below may run a container runtime: with an empty PATH, kind cannot find one.
	if err := os.Setenv("PATH", ""); err != nil {
		return err
	}
	provider := cluster.NewProvider(cluster.ProviderWithDocker())
	err = provider.Create(name, cluster.CreateWithRawConfig(raw), cluster.CreateWithConfigFile(stop))
	switch {
	case err == nil:
		return errors.New("internal error: kind's Create returned without error; expected it to stop at the second config option")
	case errors.Is(err, fs.ErrNotExist):
		return nil // kind accepted the file and stopped at the sentinel option
	default:
		return err
	}
}

// decodeV1Alpha4 decodes raw the way kind's encoding.Parse does for kind.x-k8s.io/v1alpha4, with
// kind's public types, then applies kind's defaults.
func decodeV1Alpha4(raw []byte) (*v1alpha4.Cluster, error) {
	cfg := &v1alpha4.Cluster{}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil {
		return nil, fmt.Errorf("unable to decode config: %w", err)
	}
	if cfg.APIVersion != "kind.x-k8s.io/v1alpha4" || cfg.Kind != "Cluster" {
		return nil, fmt.Errorf("want kind Cluster of kind.x-k8s.io/v1alpha4, got kind %q apiVersion %q", cfg.Kind, cfg.APIVersion)
	}
	v1alpha4.SetDefaultsCluster(cfg)
	return cfg, nil
}

func summarize(cfg *v1alpha4.Cluster) (*Summary, error) {
	var problems []error
	if !validNameRE.MatchString(cfg.Name) {
		problems = append(problems, fmt.Errorf("%q is not a valid cluster name, cluster names must match %s", cfg.Name, validNameRE))
	}
	s := &Summary{
		Name:                    cfg.Name,
		Nodes:                   []NodeSummary{},
		Roles:                   map[string]int{},
		FeatureGates:            map[string]bool{},
		RuntimeConfig:           map[string]string{},
		ContainerdConfigPatches: []ContainerdPatch{},
		KubeadmConfigPatches:    []KubeadmPatch{},
	}
	for i, n := range cfg.Nodes {
		switch n.Role {
		case v1alpha4.ControlPlaneRole, v1alpha4.WorkerRole:
		default:
			problems = append(problems, fmt.Errorf("invalid configuration for node %d: %q is not a valid node role", i, n.Role))
		}
		s.Nodes = append(s.Nodes, NodeSummary{Role: string(n.Role), Image: n.Image})
		s.Roles[string(n.Role)]++
	}
	if s.Roles[string(v1alpha4.ControlPlaneRole)] < 1 {
		problems = append(problems, fmt.Errorf("must have at least one %s node", v1alpha4.ControlPlaneRole))
	}
	for k, v := range cfg.FeatureGates {
		s.FeatureGates[k] = v
	}
	for k, v := range cfg.RuntimeConfig {
		s.RuntimeConfig[k] = v
	}
	for i, p := range cfg.ContainerdConfigPatches {
		tree, err := toml.LoadBytes([]byte(p))
		if err != nil {
			problems = append(problems, fmt.Errorf("containerdConfigPatches[%d]: %w", i, err))
			continue
		}
		parsed := tree.ToMap()
		var version int64
		if v, ok := parsed["version"].(int64); ok {
			version = v
		}
		s.ContainerdConfigPatches = append(s.ContainerdConfigPatches, ContainerdPatch{Raw: p, Parsed: parsed, Version: version})
	}
	for i, p := range cfg.KubeadmConfigPatches {
		parsed := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(p), &parsed); err != nil {
			problems = append(problems, fmt.Errorf("kubeadmConfigPatches[%d]: %w", i, err))
			continue
		}
		kind, _ := parsed["kind"].(string)
		apiVersion, _ := parsed["apiVersion"].(string)
		if kind == "" {
			problems = append(problems, fmt.Errorf("kubeadmConfigPatches[%d]: no kind, so kind cannot match it to a kubeadm document", i))
		}
		s.KubeadmConfigPatches = append(s.KubeadmConfigPatches, KubeadmPatch{Kind: kind, APIVersion: apiVersion, Parsed: parsed})
	}
	if err := errors.Join(problems...); err != nil {
		return nil, err
	}
	return s, nil
}
