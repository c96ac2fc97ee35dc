// gocompute: a cgo-linked Go program for tests/code/go_programs.rs.
//
// Usage: gocompute CALLS
//
// main calls compute(i, i%7, 3, i%5, 11) CALLS times (Go's register ABI:
// the arguments arrive in rax, rbx, rcx, rdi, rsi) while another goroutine
// allocates, walks its own stack (runtime.Callers) and forces garbage
// collections, so the runtime scans, preempts (SIGURG) and moves
// goroutines all along. compute is a leaf with no frame, so the compiler
// gives it no stack-growth check: nothing but its callers enters it, and
// weft's count must be exactly CALLS. Prints one deterministic line,
//
//	sum=S c=42 walks=ok
//
// and exits 0 (2 on bad usage).
package main

/*
static int c_scale(int x) { return 3 * x; }
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
)

//go:noinline
func compute(a, b, c, d, e int) int {
	return a*b + c - d*e
}

var garbage [][]byte

func churn(stop *atomic.Bool, done chan<- bool) {
	ok := true
	pcs := make([]uintptr, 32)
	for i := 0; !stop.Load(); i++ {
		garbage = append(garbage, make([]byte, 1024))
		if len(garbage) > 256 {
			garbage = nil
		}
		if runtime.Callers(0, pcs) < 2 {
			ok = false
		}
		if i%64 == 0 {
			runtime.GC()
		}
	}
	done <- ok
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gocompute CALLS")
		os.Exit(2)
	}
	n, err := strconv.Atoi(os.Args[1])
	if err != nil || n < 1 {
		os.Exit(2)
	}
	var stop atomic.Bool
	done := make(chan bool)
	go churn(&stop, done)
	sum := 0
	for i := 0; i < n; i++ {
		sum += compute(i, i%7, 3, i%5, 11)
	}
	stop.Store(true)
	walks := "ok"
	if !<-done {
		walks = "BAD"
	}
	fmt.Printf("sum=%d c=%d walks=%s\n", sum, int(C.c_scale(14)), walks)
}
