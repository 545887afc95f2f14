package main

// The NUMA node attribute of KEP-6072, as the official helper
// (k8s.io/dynamic-resource-allocation/deviceattribute) makes it: for the
// "numa-attribute SYSFS FORM NODE..." mode, which prints one JSON line per node
// (the attribute's value), and for the accelerator devices of --numa-nodes.

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

func numaForm(name string) (deviceattribute.AttributeForm, error) {
	switch name {
	case "scalar":
		return deviceattribute.ScalarAttribute, nil
	case "list":
		return deviceattribute.ListAttribute, nil
	}
	return 0, fmt.Errorf("NUMA attribute form %q is neither scalar nor list", name)
}

// numaAttribute is the helper's attribute of a device on NUMA node node.
func numaAttribute(sysfs, form string, node int) (resourceapi.DeviceAttribute, error) {
	attrForm, err := numaForm(form)
	if err != nil {
		return resourceapi.DeviceAttribute{}, err
	}
	attribute, err := deviceattribute.GetNUMANodeAttribute(node, attrForm, deviceattribute.WithFSFromRoot(sysfs))
	if err != nil {
		return resourceapi.DeviceAttribute{}, err
	}
	return attribute.Value, nil
}

// parseNodes reads a comma-separated list of NUMA nodes ("" is none).
func parseNodes(list string) ([]int, error) {
	var nodes []int
	for _, field := range strings.Split(list, ",") {
		if field == "" {
			continue
		}
		node, err := strconv.Atoi(field)
		if err != nil {
			return nil, fmt.Errorf("NUMA node %q: %w", field, err)
		}
		nodes = append(nodes, node)
	}
	return nodes, nil
}

func printNUMAAttributes(sysfs, form string, nodes []string) error {
	for _, arg := range nodes {
		node, err := strconv.Atoi(arg)
		if err != nil {
			return fmt.Errorf("NUMA node %q: %w", arg, err)
		}
		value, err := numaAttribute(sysfs, form, node)
		if err != nil {
			return err
		}
		line, err := json.Marshal(value)
		if err != nil {
			return err
		}
		fmt.Println(string(line))
	}
	return nil
}
