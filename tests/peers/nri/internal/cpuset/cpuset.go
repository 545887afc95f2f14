// Package cpuset reads and writes sets of CPUs (or memory nodes) in the kernel's list
// format, "0-3,8,10-11", as cpuset.cpus and the OCI spec's cpus and mems carry them.
package cpuset

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Set is a set of CPU or memory node numbers.
type Set map[int]struct{}

// Parse reads the kernel's list format; "" is the empty set.
func Parse(s string) (Set, error) {
	set := Set{}
	s = strings.TrimSpace(s)
	if s == "" {
		return set, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := number(lo)
		if err != nil {
			return nil, fmt.Errorf("invalid cpuset %q", s)
		}
		b := a
		if isRange {
			if b, err = number(hi); err != nil || b < a {
				return nil, fmt.Errorf("invalid cpuset %q", s)
			}
		}
		for i := a; i <= b; i++ {
			set[i] = struct{}{}
		}
	}
	return set, nil
}

// number is a non-negative decimal without sign or leading zeros (other than "0").
func number(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || strconv.Itoa(n) != s {
		return 0, fmt.Errorf("not a CPU number: %q", s)
	}
	return n, nil
}

// Add puts every member of o into s.
func (s Set) Add(o Set) {
	for i := range o {
		s[i] = struct{}{}
	}
}

// Minus is the members of s not in o.
func (s Set) Minus(o Set) Set {
	out := Set{}
	for i := range s {
		if _, ok := o[i]; !ok {
			out[i] = struct{}{}
		}
	}
	return out
}

// String renders the set in the kernel's list format.
func (s Set) String() string {
	ids := make([]int, 0, len(s))
	for i := range s {
		ids = append(ids, i)
	}
	sort.Ints(ids)
	var parts []string
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, strconv.Itoa(ids[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ids[i], ids[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
