package main

import "fmt"

// AllowedDestinationsEnv is the variable deploy/'s services that request
// tenants' URLs (the fetcher, the dispatcher) read their
// -allowed-destinations from: empty in deploy/, the chart's
// egress.allowedDestinations, joined with commas.
const AllowedDestinationsEnv = "HEADWATER_ALLOWED_DESTINATIONS"

// egress makes the value of container c's AllowedDestinationsEnv, where
// it has one, the chart's egress.allowedDestinations.
func (p *Parameterizer) egress(c map[string]any) error {
	env, _ := c["env"].([]any)
	for _, e := range env {
		e, ok := e.(map[string]any)
		if !ok || e["name"] != AllowedDestinationsEnv {
			continue
		}
		if v, _ := e["value"].(string); v != "" {
			return fmt.Errorf("%s is %q in deploy/: the chart's default is none", AllowedDestinationsEnv, v)
		}
		e["value"] = p.token("inline", "egress.allowedDestinations", `{{ join "," .Values.egress.allowedDestinations | quote }}`)
	}
	return nil
}
