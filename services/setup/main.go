// Command setup makes the Secrets a Headwater installation needs before
// its pods can start, so that installing needs no checkout and no tool
// but kubectl. deploy/base runs it as the Job headwater-setup.
//
//	setup ensure [-namespace NS] [-kubeconfig F] [-s3-secret S -s3-endpoint E -s3-bucket B]
//	    creates in the cluster the Secrets that are missing, and only
//	    those: one NKey seed Secret per bus identity
//	    (headwater-nats-<identity>, key "nkey"), headwater-nats-users with
//	    every identity's public key (the NATS server's environment) and,
//	    with -s3-secret, the S3 settings with random credentials. It never
//	    replaces a seed; it adds to headwater-nats-users the keys it lacks
//	    and corrects those that no longer match their seed (a rotation).
//	setup print [-namespace NS] [-s3-secret ...]
//	    prints a fresh set of the same Secrets as YAML, to encrypt with
//	    SOPS or seal for a GitOps repository, instead of running ensure.
//
// Every flag can also be set from HEADWATER_<FLAG> (see package flagenv),
// as the Job does with HEADWATER_NAMESPACE.
//
// The headwater command runs it too, as headwater -target=setup (one image
// for every role).
package main

import (
	"os"

	"github.com/headwater-gitops/headwater/services/setup/role"
)

func main() { role.Main(os.Args[1:]) }
