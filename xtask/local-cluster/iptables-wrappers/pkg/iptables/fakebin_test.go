package iptables

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeIPTablesScript stands in for iptables, ip6tables and their -save/-restore (and -nft/-legacy
// variants), so that the runner can be tested without root: it logs each command line to
// $FAKE_IPTABLES_DIR/log and keeps each chain as a file of rules, state/TABLE/CHAIN.
// iptables-save prints save-output-NAME (else save-output); iptables-restore stores its input in
// restore-input, and fails printing restore-error when that file exists. Every command fails
// with exit status 4 (a resource problem) while the file busy exists, and with 3 while broken
// does.
const fakeIPTablesScript = `#!/bin/sh
dir="$FAKE_IPTABLES_DIR"
name=$(basename "$0")
echo "$name $*" >> "$dir/log"
if [ -e "$dir/busy" ]; then echo "Another app is currently holding the xtables lock." >&2; exit 4; fi
if [ -e "$dir/broken" ]; then echo "$name: can't initialize iptables table: Permission denied" >&2; exit 3; fi
case "$name" in
*-save)
	if [ -e "$dir/save-output-$name" ]; then cat "$dir/save-output-$name"; else cat "$dir/save-output" 2>/dev/null; fi
	exit 0;;
*-restore)
	cat > "$dir/restore-input"
	if [ -e "$dir/restore-error" ]; then cat "$dir/restore-error" >&2; exit 1; fi
	exit 0;;
esac
[ "$1" = "-w" ] && [ "$2" = "5" ] && [ "$3" = "-t" ] || { echo "$name: bad command line: $*" >&2; exit 2; }
table=$4 op=$5 chain=$6
shift 6
rule="$*"
file="$dir/state/$table/$chain"
missing() { echo "iptables: No chain/target/match by that name." >&2; exit 1; }
case "$op" in
-N) [ -e "$file" ] && { echo "iptables: Chain already exists." >&2; exit 1; }
	mkdir -p "$dir/state/$table" && : > "$file";;
-S) [ -e "$file" ] || missing
	echo "-N $chain";;
-F) [ -e "$file" ] || missing
	: > "$file";;
-X) [ -e "$file" ] || missing
	[ -s "$file" ] && { echo "iptables: Directory not empty." >&2; exit 1; }
	rm "$file";;
-C) [ -e "$file" ] && grep -qxF -- "$rule" "$file" && exit 0
	echo "iptables: Bad rule (does a matching rule exist in that chain?)." >&2; exit 1;;
-A) [ -e "$file" ] || missing
	echo "$rule" >> "$file";;
-I) [ -e "$file" ] || missing
	{ echo "$rule"; cat "$file"; } > "$file.new" && mv "$file.new" "$file";;
-D) grep -qxF -- "$rule" "$file" 2>/dev/null || { echo "iptables: Bad rule (does a matching rule exist in that chain?)." >&2; exit 1; }
	grep -vxF -- "$rule" "$file" > "$file.new"; mv "$file.new" "$file";;
*) echo "$name: unknown option $op" >&2; exit 2;;
esac
`

// fakeHost is a directory of fake iptables binaries that is first on PATH for one test.
type fakeHost struct {
	t   *testing.T
	dir string
}

// newFakeHost installs the fake as the given binaries (all of iptables' and ip6tables' plain
// names when none are given) with nat's POSTROUTING, and puts them first on PATH, before only
// /usr/bin and /bin (which have the shell tools the fake uses, and on Debian no iptables).
func newFakeHost(t *testing.T, names ...string) *fakeHost {
	t.Helper()
	if len(names) == 0 {
		names = []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}
	}
	h := &fakeHost{t: t, dir: t.TempDir()}
	bin := filepath.Join(h.dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(fakeIPTablesScript), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+"/usr/bin"+string(os.PathListSeparator)+"/bin")
	t.Setenv("FAKE_IPTABLES_DIR", h.dir)
	h.addChain(TableNAT, ChainPostrouting)
	return h
}

// addChain creates chain in table, as the kernel or another program would.
func (h *fakeHost) addChain(table Table, chain Chain) {
	h.t.Helper()
	h.write(filepath.Join("state", string(table), string(chain)), "")
}

// removeChain deletes chain from table, as a firewall reload would.
func (h *fakeHost) removeChain(table Table, chain Chain) {
	h.t.Helper()
	if err := os.Remove(filepath.Join(h.dir, "state", string(table), string(chain))); err != nil {
		h.t.Fatal(err)
	}
}

// hasChain says whether table has chain.
func (h *fakeHost) hasChain(table Table, chain Chain) bool {
	_, err := os.Stat(filepath.Join(h.dir, "state", string(table), string(chain)))
	return err == nil
}

// rules returns the rules of chain in table, one string of arguments per rule.
func (h *fakeHost) rules(table Table, chain Chain) []string {
	h.t.Helper()
	return lines(h.read(filepath.Join("state", string(table), string(chain))))
}

// log returns the command lines run so far, and forgets them.
func (h *fakeHost) log() []string {
	h.t.Helper()
	logged := lines(h.read("log"))
	for i := range logged {
		logged[i] = strings.TrimSpace(logged[i])
	}
	_ = os.Remove(filepath.Join(h.dir, "log"))
	return logged
}

// setFile writes name (relative to the fake's directory), or removes it when content is nil.
func (h *fakeHost) setFile(name string, content []byte) {
	h.t.Helper()
	if content == nil {
		_ = os.Remove(filepath.Join(h.dir, name))
		return
	}
	h.write(name, string(content))
}

func (h *fakeHost) write(name, content string) {
	h.t.Helper()
	path := filepath.Join(h.dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *fakeHost) read(name string) string {
	h.t.Helper()
	data, err := os.ReadFile(filepath.Join(h.dir, name))
	if err != nil && !os.IsNotExist(err) {
		h.t.Fatal(err)
	}
	return string(data)
}

func lines(s string) []string {
	return slices.DeleteFunc(strings.Split(s, "\n"), func(line string) bool { return line == "" })
}
