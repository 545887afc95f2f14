package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
)

// hugePage is the size of the pages mapHugePages asks for: the kernel's default huge page
// size, which MAP_HUGETLB without a size flag takes (2 MiB on x86).
const hugePage = 2 << 20

// hugePageTrials maps, touches and unmaps each amount of bytes WORKLOAD_HUGEPAGES names
// (comma-separated), one after the other: amount -> "ok" or what failed. A limit of the
// hugetlb controller refuses a reservation at mmap (rsvd.max) or a page at its first touch
// (max, a SIGBUS): both are reported, neither ends the program.
func hugePageTrials() map[string]string {
	value := strings.TrimSpace(os.Getenv("WORKLOAD_HUGEPAGES"))
	if value == "" {
		return nil
	}
	results := map[string]string{}
	for _, field := range strings.Split(value, ",") {
		field = strings.TrimSpace(field)
		amount, err := strconv.Atoi(field)
		if err != nil || amount <= 0 || amount%hugePage != 0 {
			results[field] = fmt.Sprintf("not a whole number of %d-byte pages", hugePage)
			continue
		}
		results[field] = mapHugePages(amount)
	}
	return results
}

func mapHugePages(amount int) (outcome string) {
	memory, err := syscall.Mmap(-1, 0, amount, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_HUGETLB)
	if err != nil {
		return "mmap: " + err.Error()
	}
	defer syscall.Munmap(memory)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if fault := recover(); fault != nil {
			outcome = fmt.Sprintf("touch: %v", fault)
		}
	}()
	for offset := 0; offset < amount; offset += hugePage {
		memory[offset] = 1
	}
	return "ok"
}
