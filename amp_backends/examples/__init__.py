"""The tutorials' MNIST CNN and GAN as plain functions: ``mnist.train_mnist``, ``gan.train_gan`` and their
``run.RunOptions``. Their command line is ``amp_backends.commands.train_command``.
"""
