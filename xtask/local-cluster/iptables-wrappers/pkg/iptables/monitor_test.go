package iptables

import (
	"context"
	"testing"
	"time"
)

// setFlushWait makes Monitor wait up to timeout for a flush to reach every table, polling every
// 5ms, for one test.
func setFlushWait(t *testing.T, timeout time.Duration) {
	oldTimeout, oldPoll := flushTimeout, flushPoll
	flushTimeout, flushPoll = timeout, 5*time.Millisecond
	t.Cleanup(func() { flushTimeout, flushPoll = oldTimeout, oldPoll })
}

// eventually fails t unless condition holds within 10 seconds.
func eventually(t *testing.T, what string, condition func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !condition() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startMonitor runs client.Monitor in a goroutine until the returned stop is called or t ends,
// and makes t wait for it to return before the fake host goes.
func startMonitor(t *testing.T, client Interface, canary Chain, tables []Table, reloadFunc func()) (stop func() bool) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		client.Monitor(ctx, canary, tables, reloadFunc, 10*time.Millisecond)
	}()
	stop = func() bool {
		cancel()
		select {
		case <-done:
			return true
		case <-time.After(10 * time.Second):
			return false
		}
	}
	t.Cleanup(func() { stop() })
	return stop
}

func TestMonitorReloadsAfterAFlush(t *testing.T) {
	setFlushWait(t, time.Minute)
	h := newFakeHost(t)
	client, err := New(t.Context(), ProtocolIPv4, UseInstalledMode)
	if err != nil {
		t.Fatal(err)
	}
	const canary Chain = "KUBE-PROXY-CANARY"
	tables := []Table{TableMangle, TableNAT, TableFilter}
	canariesExist := func() bool {
		for _, table := range tables {
			if !h.hasChain(table, canary) {
				return false
			}
		}
		return true
	}
	reloads := make(chan struct{}, 10)
	stop := startMonitor(t, client, canary, tables, func() { reloads <- struct{}{} })
	eventually(t, "the canaries exist", canariesExist)

	// A flush that takes the canaries one table after the other: Monitor reloads once, after
	// the last one went (it created them again after, so they all exist).
	h.removeChain(TableMangle, canary)
	time.Sleep(50 * time.Millisecond)
	if len(reloads) != 0 {
		t.Fatal("Monitor reloaded while the flush had not reached nat and filter")
	}
	h.removeChain(TableNAT, canary)
	h.removeChain(TableFilter, canary)
	select {
	case <-reloads:
	case <-time.After(10 * time.Second):
		t.Fatal("Monitor did not reload after the canaries went")
	}
	eventually(t, "the canaries exist again", canariesExist)

	// While iptables cannot tell (the lock is held), Monitor does not take that for a flush.
	h.setFile("busy", []byte{})
	time.Sleep(50 * time.Millisecond)
	if len(reloads) != 0 {
		t.Fatal("Monitor reloaded while iptables could not tell")
	}
	h.setFile("busy", nil)

	if !stop() {
		t.Fatal("Monitor did not return when its context was done")
	}
	for _, table := range tables {
		if h.hasChain(table, canary) {
			t.Errorf("Monitor left its canary in %s", table)
		}
	}
}

func TestMonitorReloadsAnywayWhenAFlushStaysPartial(t *testing.T) {
	setFlushWait(t, 100*time.Millisecond)
	h := newFakeHost(t)
	client, err := New(t.Context(), ProtocolIPv4, UseInstalledMode)
	if err != nil {
		t.Fatal(err)
	}
	reloads := make(chan struct{}, 10)
	startMonitor(t, client, "CANARY", []Table{TableMangle, TableFilter}, func() { reloads <- struct{}{} })
	eventually(t, "the canaries exist", func() bool { return h.hasChain(TableMangle, "CANARY") && h.hasChain(TableFilter, "CANARY") })
	h.removeChain(TableMangle, "CANARY")
	select {
	case <-reloads:
	case <-time.After(10 * time.Second):
		t.Fatal("Monitor did not reload after flushTimeout")
	}
}

func TestMonitorRetriesCreatingTheCanaries(t *testing.T) {
	h := newFakeHost(t)
	client, err := New(t.Context(), ProtocolIPv4, UseInstalledMode)
	if err != nil {
		t.Fatal(err)
	}
	h.setFile("broken", []byte{})
	reloads := make(chan struct{}, 10)
	startMonitor(t, client, "CANARY", []Table{TableFilter}, func() { reloads <- struct{}{} })
	time.Sleep(50 * time.Millisecond)
	h.setFile("broken", nil)
	eventually(t, "the canary exists", func() bool { return h.hasChain(TableFilter, "CANARY") })
	if len(reloads) != 0 {
		t.Error("Monitor reloaded although the canary never went")
	}
}
