package main

// The "decode-metadata FILE" mode: how a program using the official reader
// (k8s.io/dynamic-resource-allocation/devicemetadata) sees a device metadata file. Each
// object of the file's stream is decoded on its own, into its own API version, with the
// API's validation; the result is one JSON line per object: its apiVersion, the validation
// error (empty if valid) and the object as decoded.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

type decodedMetadata struct {
	APIVersion string         `json:"apiVersion"`
	Invalid    string         `json:"invalid"`
	Decoded    runtime.Object `json:"decoded"`
}

func decodeMetadata(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	stream := json.NewDecoder(bytes.NewReader(data))
	out := json.NewEncoder(os.Stdout)
	for stream.More() {
		var raw json.RawMessage
		if err := stream.Decode(&raw); err != nil {
			return fmt.Errorf("read the stream: %w", err)
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			return err
		}
		var dest runtime.Object
		switch head.APIVersion {
		case metadatav1beta1.SchemeGroupVersion.String():
			dest = &metadatav1beta1.DeviceMetadata{}
		case metadatav1alpha1.SchemeGroupVersion.String():
			dest = &metadatav1alpha1.DeviceMetadata{}
		default:
			return fmt.Errorf("unknown apiVersion %q", head.APIVersion)
		}
		var invalid error
		one := json.NewDecoder(bytes.NewReader(raw))
		if err := devicemetadata.DecodeMetadataFromStream(one, dest, devicemetadata.DecodeMetadataWithValidationResult(&invalid)); err != nil {
			return fmt.Errorf("decode %s: %w", head.APIVersion, err)
		}
		result := decodedMetadata{APIVersion: head.APIVersion, Decoded: dest}
		if invalid != nil {
			result.Invalid = invalid.Error()
		}
		if err := out.Encode(result); err != nil {
			return err
		}
	}
	return nil
}
