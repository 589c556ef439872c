// Command hello is the only program of the test images that `cluster load` and the local
// registry deliver: it prints the contents of /message (which tells the images apart) and exits.
package main

import (
	"fmt"
	"os"
)

func main() {
	msg, err := os.ReadFile("/message")
	if err != nil {
		fmt.Fprintln(os.Stderr, "hello:", err)
		os.Exit(1)
	}
	fmt.Print(string(msg))
}
