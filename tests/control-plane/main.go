// Command control-plane runs one upstream Kubernetes control-plane component, chosen by its
// first argument (or by the name it was invoked as, like the old hyperkube):
//
//	control-plane etcd [etcd flags]
//	control-plane kube-apiserver [flags]
//	control-plane kube-controller-manager [flags]
//	control-plane kubectl [args]
//
// Each component is the upstream command, unchanged: its flags, its defaults, its exit codes.
// Run each in its own process; feature gates, klog and metrics registries are process-global.
//
// This is test support for ginx's integration tests (tests/support/control_plane.rs). It is
// not part of ginx, which stays pure Rust.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // CronJob time zones, as the upstream kube-apiserver binary has

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

const usage = "usage: control-plane etcd|kube-apiserver|kube-controller-manager|kubectl [ARGS...]"

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if !isComponent(name) {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	// Every upstream command reads os.Args itself (cobra, etcd's flag set, kubectl's
	// verbosity pre-parse): make it look as if the component had been run directly.
	os.Args = append([]string{name}, args...)

	switch name {
	case "etcd":
		etcdmain.Main(os.Args)
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kubectl":
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) //nolint:errcheck
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
	default:
		fmt.Fprintf(os.Stderr, "control-plane: unknown component %q\n%s\n", name, usage)
		os.Exit(2)
	}
}

func isComponent(name string) bool {
	switch name {
	case "etcd", "kube-apiserver", "kube-controller-manager", "kubectl":
		return true
	}
	return false
}
